# mlfs: hand-written Makefile (STYLE.md 12).
#   make            build bin/mlfs, bin/mlfs-snap, bin/mlfs-stat
#   make DEBUG=1    the same with ASan and UBSan, in build/debug/bin (beside bin/)
#   make TSAN=1     the same with ThreadSanitizer, in build/tsan/bin
#   make test       install missing Debian packages, build, then: C unit tests, the unit
#                   tests under ASan+UBSan (asan-unit) and TSan (tsan-unit), pytest, pytest
#                   again against the ASan+UBSan build (asan-integration); see "test:"
#   make demo       install missing packages, build, run the demo job
#   make bench      install missing packages, build, run the benchmarks
#   make install PREFIX=/usr/local [DESTDIR=...]
#   V=1             print full command lines

CC ?= cc
CFLAGS ?= -O2 -g
PREFIX ?= /usr/local
PYTHON ?= /usr/bin/python3
PKGS := fuse3 liburing liblz4 libxxhash

override CFLAGS += -std=gnu11 -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
	-Wmissing-prototypes -Wno-unused-parameter -D_GNU_SOURCE -pthread -I. -MMD -MP \
	$(shell pkg-config --cflags $(PKGS) 2>/dev/null)
override LDLIBS += $(shell pkg-config --libs $(PKGS) 2>/dev/null) -pthread -lm

# Each build has its own object tree and bin directory, so that a release, an ASan and a
# TSan build coexist (make test uses all three).
ifeq ($(DEBUG)$(TSAN),11)
$(error DEBUG=1 and TSAN=1 do not combine: ASan and TSan are exclusive)
endif
ifeq ($(DEBUG),1)
B := build/debug
BIN := $(B)/bin
# clang when the user named no compiler: its ASan runtime carries UBSan, so one
# log_path (ASAN_OPTIONS) catches both kinds of report, also from the daemon, whose
# stderr is /dev/null once it detaches; gcc's separate libubsan writes only to stderr.
ifeq ($(origin CC),default)
CC := $(if $(shell command -v clang 2>/dev/null),clang,cc)
endif
override CFLAGS += -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
override LDFLAGS += -fsanitize=address,undefined
else ifeq ($(TSAN),1)
B := build/tsan
BIN := $(B)/bin
override CFLAGS += -O1 -fno-omit-frame-pointer -fsanitize=thread
override LDFLAGS += -fsanitize=thread
else
B := build/release
BIN := bin
endif

ifeq ($(V),1)
Q :=
else
Q := @
endif

# Every .c in cache/, tiering/ and fs/ (but fs/main.c) goes into one static library that
# the daemon, the tools and the unit tests link against.
LIB_SRCS := $(sort $(wildcard cache/*.c tiering/*.c) $(filter-out fs/main.c,$(wildcard fs/*.c)))
LIB_OBJS := $(LIB_SRCS:%.c=$(B)/%.o)
LIB := $(B)/libmlfs.a
BINS := $(BIN)/mlfs $(BIN)/mlfs-snap $(BIN)/mlfs-stat
UNIT_SRCS := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(B)/tests/%)
MAN := $(wildcard man/*.1 man/*.8)
# The random-operation tester (tests/fsx/fsx.c) that tests/integration/test_fsx.py runs on
# MOUNT/ckpt; a standalone program, not linked with libmlfs.
FSX := $(B)/tests/mlfs-fsx

.PHONY: all deps test unit integration asan-unit tsan-unit asan-integration demo bench bench-goals \
	install clean
all: $(BINS) $(FSX)

$(B)/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC  $<")
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

$(LIB): $(LIB_OBJS)
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(BIN)/mlfs: $(B)/fs/main.o $(LIB)
$(BIN)/mlfs-snap: $(B)/tools/mlfs-snap.o $(patsubst %.c,$(B)/%.o,$(wildcard tools/snap_*.c)) $(LIB)
$(BIN)/mlfs-stat: $(B)/tools/mlfs-stat.o $(LIB)
$(BINS):
	@mkdir -p $(BIN)
	@$(if $(Q),echo "  LD  $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(FSX): $(B)/tests/fsx/fsx.o
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^

$(B)/tests/%: $(B)/tests/unit/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

deps:
	$(Q)scripts/deps.sh build

# Unit tests: one program per module, each prints "N passed, N failed"; the last line is
# the total over all of them. Built with DEBUG=1 or TSAN=1 they run under that sanitizer
# (options below), and a sanitizer report fails the program.
unit: $(UNIT_BINS)
	$(Q)scripts/run-unit.sh $(UNIT_BINS)

# pytest against this build's binaries: bin/ by default (MLFS_BIN_DIR, if set, wins), the
# sanitizer build's own bin directory with DEBUG=1 or TSAN=1. With a sanitized build the
# fixtures send every report of the daemon and the tools to files and fail the test that
# caused one (tests/integration/conftest.py, "Sanitizers").
integration: $(BINS) $(FSX)
	$(Q)$(if $(filter-out bin,$(BIN)),MLFS_BIN_DIR='$(CURDIR)/$(BIN)') MLFS_FSX='$(CURDIR)/$(FSX)' \
	$(PYTHON) -m pytest -q tests/integration $(PYTEST_ARGS)

# Sanitizer options (the environment's own, if set, win). ASan: any error, or a leak at
# exit (LeakSanitizer), ends the process with a report and a non-zero status; UBSan (built
# with -fno-sanitize-recover) the same, with a stack. TSan: the first data race, deadlock
# or signal-unsafe call ends the program with status 66.
ifeq ($(DEBUG),1)
export ASAN_OPTIONS ?= detect_leaks=1:halt_on_error=1:malloc_context_size=20
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
endif
ifeq ($(TSAN),1)
export TSAN_OPTIONS ?= halt_on_error=1:exitcode=66:second_deadlock_stack=1:history_size=4
endif

# The C unit tests under ASan+UBSan (build/debug) and ThreadSanitizer (build/tsan); the
# integration suite against the ASan+UBSan build.
asan-unit:
	$(Q)$(MAKE) --no-print-directory DEBUG=1 unit
tsan-unit:
	$(Q)$(MAKE) --no-print-directory TSAN=1 unit
asan-integration:
	$(Q)$(MAKE) --no-print-directory DEBUG=1 integration

# make test: the release build first (a build failure stops here), then every stage,
# even after one failed, each timed; fails at the end if any stage did.
TEST_STAGES := unit asan-unit tsan-unit fuzz integration asan-integration
test:
	$(Q)scripts/deps.sh test
	$(Q)$(MAKE) --no-print-directory all $(UNIT_BINS)
	$(Q)failed=; for s in $(TEST_STAGES); do \
		t0=$$(date +%s); \
		$(MAKE) --no-print-directory $$s || failed="$$failed $$s"; \
		echo "make test: $$s took $$(( $$(date +%s) - t0 )) s"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$$failed" >&2; exit 1; fi; \
	echo "make test: all stages passed ($(TEST_STAGES))"

demo:
	$(Q)scripts/deps.sh test
	$(Q)$(MAKE) --no-print-directory all
	$(Q)$(PYTHON) scripts/demo.py

# All benchmarks: data path (issue 5), tiering (issue 3), snapshots (issue 4), a neighbour
# in mlfs's memory cgroup and checkpoint writes (issue 12: bench/neighbour.py,
# bench/ckpt_write.py, bench/epoch_open.py; bench/goals.py prints the issue's table from
# them), many workers and the store's throughput on ext4 and GlusterFS
# (issue 11, bench/multiworker.py --store-bench, which runs bench/store_bench.py on both).
# BENCH_ARGS goes to bench/run.sh whole; of it, only --quick goes to the others (they take no
# --only/--rounds of run.sh's kind). One failing benchmark does not skip the others; make
# fails at the end if any did. Each script also runs alone.
# The benchmarks behind the figures of issues 11 and 12 only (bench/goals.py's table and
# the store rows), in the same order as in `make bench`: about 10 minutes here.
GOALS_BENCH = \
	$(PYTHON) bench/neighbour.py $(filter --quick,$(BENCH_ARGS)) || { rc=1; echo "make bench: bench/neighbour.py failed" >&2; }; \
	$(PYTHON) bench/ckpt_write.py $(filter --quick,$(BENCH_ARGS)) || { rc=1; echo "make bench: bench/ckpt_write.py failed" >&2; }; \
	$(PYTHON) bench/multiworker.py --store-bench $(filter --quick,$(BENCH_ARGS)) || { rc=1; echo "make bench: bench/multiworker.py failed" >&2; }; \
	$(PYTHON) bench/epoch_open.py $(filter --quick,$(BENCH_ARGS)) || { rc=1; echo "make bench: bench/epoch_open.py failed" >&2; }; \
	$(PYTHON) bench/goals.py $(filter --quick,$(BENCH_ARGS)) || { rc=1; echo "make bench: bench/goals.py failed" >&2; };

bench-goals:
	$(Q)scripts/deps.sh bench
	$(Q)$(MAKE) --no-print-directory all
	$(Q)export PYTHON='$(PYTHON)'; rc=0; $(GOALS_BENCH) exit $$rc

bench:
	$(Q)scripts/deps.sh bench
	$(Q)$(MAKE) --no-print-directory all
	$(Q)export PYTHON='$(PYTHON)'; rc=0; \
	bench/run.sh $(BENCH_ARGS) || { rc=1; echo "make bench: bench/run.sh failed" >&2; }; \
	bench/tiering.sh $(filter --quick,$(BENCH_ARGS)) || { rc=1; echo "make bench: bench/tiering.sh failed" >&2; }; \
	$(PYTHON) bench/snap_bench.py $(filter --quick,$(BENCH_ARGS)) || { rc=1; echo "make bench: bench/snap_bench.py failed" >&2; }; \
	$(GOALS_BENCH) \
	exit $$rc

install: $(BINS)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man8
	install -m 755 $(BINS) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(filter %.1,$(MAN)) $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 644 $(filter %.8,$(MAN)) $(DESTDIR)$(PREFIX)/share/man/man8/

clean:
	rm -rf build bin

# ---- fuzzing (issue 9) ------------------------------------------------------------
# libFuzzer targets (tests/fuzz/fuzz_*.c), built with Debian's clang and ASan+UBSan into
# build/fuzz/. `make fuzz` runs each for FUZZ_SECONDS (default 60; MLFS_FUZZ_SECONDS in
# the environment overrides) from its committed seeds (tests/fuzz/seeds/<target>) plus
# the corpus it grew before (build/fuzz/corpus/<target>), prints how many inputs it ran
# and fails on the first crash, leak or broken property (the input is left in
# build/fuzz/crash-*: reproduce with build/fuzz/fuzz_<target> FILE).
FUZZ_CC ?= clang
FUZZ_SECONDS ?= $(or $(MLFS_FUZZ_SECONDS),60)
FUZZ_TARGETS := manifest ctl pack lease ckpt
FUZZ_FLAGS := -std=gnu11 -g -O1 -fno-omit-frame-pointer -D_GNU_SOURCE -I. \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	$(shell pkg-config --cflags fuse3 libxxhash 2>/dev/null)
FUZZ_LIBS := -llz4 -lxxhash -pthread

.PHONY: fuzz fuzz-build fuzz-seeds
# Rewrites the committed seeds with mlfs's own encoder (after a format change).
fuzz-seeds: $(LIB)
	@mkdir -p build/fuzz tests/fuzz/seeds/manifest tests/fuzz/seeds/ctl
	$(Q)$(CC) $(CFLAGS) -o build/fuzz/seedgen tests/fuzz/seedgen.c $(LIB) $(LDLIBS)
	$(Q)build/fuzz/seedgen tests/fuzz/seeds/manifest tests/fuzz/seeds/ctl

fuzz-build: $(FUZZ_TARGETS:%=build/fuzz/fuzz_%)

build/fuzz/fuzz_manifest: tests/fuzz/fuzz_manifest.c fs/manifest.c fs/manifest.h
build/fuzz/fuzz_ctl: tests/fuzz/fuzz_ctl.c fs/ctl.c cache/log.c fs/ctl.h fs/mlfs.h
build/fuzz/fuzz_pack: tests/fuzz/fuzz_pack.c fs/pack.c fs/hset.c fs/fdio.c cache/log.c fs/pack.h fs/hset.h fs/fdio.h
build/fuzz/fuzz_lease: tests/fuzz/fuzz_lease.c fs/lease.c fs/fdio.c cache/log.c fs/lease.h fs/fdio.h
# MOUNT/ckpt with its block cache and an unstarted tier (no threads, no spill): its
# write admission and read-ahead are the daemon's own code.
build/fuzz/fuzz_ckpt: tests/fuzz/fuzz_ckpt.c fs/ckpt.c fs/ckpt_xattr.c fs/ckpt_snap.c fs/acl.c \
	fs/manifest.c cache/bcache.c cache/log.c tiering/tier.c tiering/spill.c tiering/uring.c \
	tiering/gov.c fs/ckpt.h fs/ckpt_int.h fs/acl.h fs/manifest.h fs/mlfs.h cache/bcache.h \
	tiering/tier.h
build/fuzz/fuzz_ckpt: FUZZ_LIBS += $(shell pkg-config --libs fuse3 liburing 2>/dev/null)
$(FUZZ_TARGETS:%=build/fuzz/fuzz_%):
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  FUZZ-CC $@")
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $(filter %.c,$^) $(FUZZ_LIBS)

fuzz: fuzz-build
	$(Q)rc=0; for t in $(FUZZ_TARGETS); do \
		mkdir -p build/fuzz/corpus/$$t; \
		build/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
			-artifact_prefix=build/fuzz/ -max_len=65536 \
			build/fuzz/corpus/$$t tests/fuzz/seeds/$$t >build/fuzz/$$t.log 2>&1; \
		r=$$?; \
		n=$$(sed -n 's/^stat::number_of_executed_units: *//p' build/fuzz/$$t.log); \
		echo "fuzz $$t: $${n:-?} executions in $(FUZZ_SECONDS) s, exit $$r"; \
		if [ $$r != 0 ]; then rc=1; tail -n 40 build/fuzz/$$t.log; fi; \
	done; exit $$rc
# ---- end of fuzzing -----------------------------------------------------------------

-include $(shell find build -name '*.d' 2>/dev/null)
