/*
 * test_passthrough.c - the wire side of FUSE passthrough (fs/passthrough.h): which
 * replies the write hook patches and how, without a kernel.
 */
#include <errno.h>
#include <linux/fuse.h>
#include <string.h>
#include <sys/uio.h>

#include "fs/passthrough.h"
#include "tests/unit/test.h"

/* A reply as libfuse 3.14 writes it: the header, then one argument. */
struct reply {
	struct fuse_out_header oh;
	unsigned char arg[64];
	struct iovec iov[2];
};

static struct iovec *reply_init(struct reply *r, size_t len, int error)
{
	memset(r, 0, sizeof(*r));
	r->oh.len = sizeof(r->oh) + len;
	r->oh.error = error;
	r->iov[0] = (struct iovec){ &r->oh, sizeof(r->oh) };
	r->iov[1] = (struct iovec){ r->arg, len };
	return r->iov;
}

/* The INIT request of a kernel that offers passthrough (flags2 bit 5) or not. */
static void kernel_init(int offer)
{
	struct {
		struct fuse_in_header in;
		struct fuse_init_in init;
	} req = { 0 };

	req.in.opcode = FUSE_INIT;
	req.init.major = 7;
	req.init.minor = 45;
	req.init.flags = FUSE_INIT_EXT;
	req.init.flags2 = offer ? 1u << 5 : 0;
	pt_note_init_in(&req, sizeof(req));
}

static void test_init_reply(void)
{
	struct reply r;
	uint32_t w[16];

	/* Not allowed (off, not root...): nothing asked, nothing patched. */
	pt_configure(false, 99);
	kernel_init(1);
	EXPECT(!pt_want());
	pt_patch_reply(reply_init(&r, 64, 0), 2);
	memcpy(w, r.arg, sizeof(w));
	EXPECT_EQ(w[3], 0);
	EXPECT_EQ(w[9], 0);

	/* Allowed, but the kernel does not offer it. */
	pt_configure(true, 99);
	kernel_init(0);
	EXPECT(!pt_want());
	EXPECT(!pt_active());

	/* Offered and allowed: the next reply of this thread is the INIT reply. */
	kernel_init(1);
	EXPECT(pt_want());
	EXPECT(pt_active());
	pt_patch_reply(reply_init(&r, 64, 0), 2);
	memcpy(w, r.arg, sizeof(w));
	EXPECT(w[3] & FUSE_INIT_EXT);	 /* flags */
	EXPECT_EQ(w[8], 1u << 5);	 /* flags2: FUSE_PASSTHROUGH (bit 37) */
	EXPECT_EQ(w[9], 1);		 /* max_stack_depth, after flags2 */
	/* The mark is spent: the reply after it is left alone. */
	pt_patch_reply(reply_init(&r, 64, 0), 2);
	memcpy(w, r.arg, sizeof(w));
	EXPECT_EQ(w[8], 0);

	/* An INIT answered with an error is not patched, and the mark goes with it. */
	EXPECT(pt_want());
	pt_patch_reply(reply_init(&r, 0, -EPROTO), 1);
	pt_patch_reply(reply_init(&r, 64, 0), 2);
	memcpy(w, r.arg, sizeof(w));
	EXPECT_EQ(w[8], 0);
}

static void test_open_reply(void)
{
	struct reply r;
	struct fuse_open_out o;
	int32_t id;

	/* Marked: FOPEN_PASSTHROUGH, the id, and keep_cache cleared (the kernel refuses it). */
	pt_mark_open(7);
	pt_patch_reply(reply_init(&r, sizeof(o), 0), 2);
	memcpy(&o, r.arg, sizeof(o));
	memcpy(&id, &o.padding, sizeof(id));
	EXPECT(o.open_flags & (1u << 7));
	EXPECT(!(o.open_flags & FOPEN_DIRECT_IO));
	EXPECT_EQ(id, 7);

	pt_mark_open(8);
	reply_init(&r, sizeof(o), 0);
	((struct fuse_open_out *)r.arg)->open_flags = FOPEN_KEEP_CACHE;
	pt_patch_reply(r.iov, 2);
	memcpy(&o, r.arg, sizeof(o));
	EXPECT(!(o.open_flags & FOPEN_KEEP_CACHE));

	/* Unmarked replies of the same size (a 16-byte read, say) are never touched. */
	pt_patch_reply(reply_init(&r, sizeof(o), 0), 2);
	memcpy(&o, r.arg, sizeof(o));
	EXPECT_EQ(o.open_flags, 0);

	/* A mark the reply did not consume is cleared by pt_unmark. */
	pt_mark_open(10);
	pt_unmark();
	pt_patch_reply(reply_init(&r, sizeof(o), 0), 2);
	memcpy(&o, r.arg, sizeof(o));
	EXPECT_EQ(o.open_flags, 0);

	/* A marked reply that is not an open reply (wrong size) is left as it is. */
	pt_mark_open(11);
	pt_patch_reply(reply_init(&r, 8, 0), 2);
	EXPECT_EQ(r.arg[0], 0);
	pt_patch_reply(reply_init(&r, sizeof(o), 0), 2);
	memcpy(&o, r.arg, sizeof(o));
	EXPECT_EQ(o.open_flags, 0);
}

int main(void)
{
	struct pt_stats st;

	test_init_reply();
	test_open_reply();
	pt_get_stats(&st);
	EXPECT_EQ(st.opens, 4);
	EXPECT_EQ(st.backing_ids, 0);
	return test_summary();
}
