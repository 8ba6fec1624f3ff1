/*
 * utf8.h - what the tools and the daemon's figures need of UTF-8 to print names and
 * paths that are safe to show: the length of one valid sequence.
 *
 * Contract: header-only, pure, any thread. "Valid" is RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF.
 */
#ifndef MLFS_UTF8_H
#define MLFS_UTF8_H

/* Length of the valid UTF-8 sequence at p (1 to 4 bytes), or 0 if p[0] starts none.
 * Reads no further than a NUL (which fails any continuation byte). */
static inline int utf8_len(const unsigned char *p)
{
	unsigned c = p[0], lo = 0x80, hi = 0xbf;
	int n = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 :
		c >= 0xf0 && c <= 0xf4 ? 4 : 0;

	if (c == 0xe0)
		lo = 0xa0; /* overlong */
	else if (c == 0xed)
		hi = 0x9f; /* surrogates */
	else if (c == 0xf0)
		lo = 0x90; /* overlong */
	else if (c == 0xf4)
		hi = 0x8f; /* above U+10FFFF */
	for (int i = 1; i < n; i++)
		if (p[i] < (i == 1 ? lo : 0x80) || p[i] > (i == 1 ? hi : 0xbf))
			return 0;
	return n;
}

#endif
