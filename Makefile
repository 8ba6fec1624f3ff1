# mlfs: hand-written Makefile (STYLE.md 12).
#   make            build bin/mlfs, bin/mlfs-snap, bin/mlfs-stat
#   make DEBUG=1    the same with ASan and UBSan
#   make test       install missing Debian packages, build, run C unit tests and pytest
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

ifeq ($(DEBUG),1)
B := build/debug
override CFLAGS += -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
override LDFLAGS += -fsanitize=address,undefined
else
B := build/release
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
BINS := bin/mlfs bin/mlfs-snap bin/mlfs-stat
UNIT_SRCS := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(B)/tests/%)
MAN := $(wildcard man/*.1 man/*.8)

.PHONY: all deps test unit integration demo bench install clean
all: $(BINS)

$(B)/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC  $<")
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

$(LIB): $(LIB_OBJS)
	$(Q)rm -f $@ && $(AR) rcs $@ $^

bin/mlfs: $(B)/fs/main.o $(LIB)
bin/mlfs-snap: $(B)/tools/mlfs-snap.o $(patsubst %.c,$(B)/%.o,$(wildcard tools/snap_*.c)) $(LIB)
bin/mlfs-stat: $(B)/tools/mlfs-stat.o $(LIB)
$(BINS):
	@mkdir -p bin
	@$(if $(Q),echo "  LD  $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(B)/tests/%: $(B)/tests/unit/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

deps:
	$(Q)scripts/deps.sh build

# Unit tests: one program per module, each prints "N passed, N failed"; the last line is
# the total over all of them.
unit: $(UNIT_BINS)
	$(Q)scripts/run-unit.sh $(UNIT_BINS)

integration: $(BINS)
	$(Q)$(PYTHON) -m pytest -q tests/integration $(PYTEST_ARGS)

test:
	$(Q)scripts/deps.sh test
	$(Q)$(MAKE) --no-print-directory all $(UNIT_BINS)
	$(Q)$(MAKE) --no-print-directory unit
	$(Q)$(MAKE) --no-print-directory integration
	$(Q)$(MAKE) --no-print-directory fuzz

demo:
	$(Q)scripts/deps.sh test
	$(Q)$(MAKE) --no-print-directory all
	$(Q)$(PYTHON) scripts/demo.py

# All benchmarks: data path (issue 5), tiering (issue 3), snapshots (issue 4). BENCH_ARGS
# goes to bench/run.sh whole; of it, only --quick goes to the other two (they take no
# --only/--rounds of run.sh's kind). One failing benchmark does not skip the others; make
# fails at the end if any did. Each script also runs alone.
bench:
	$(Q)scripts/deps.sh bench
	$(Q)$(MAKE) --no-print-directory all
	$(Q)export PYTHON='$(PYTHON)'; rc=0; \
	bench/run.sh $(BENCH_ARGS) || { rc=1; echo "make bench: bench/run.sh failed" >&2; }; \
	bench/tiering.sh $(filter --quick,$(BENCH_ARGS)) || { rc=1; echo "make bench: bench/tiering.sh failed" >&2; }; \
	$(PYTHON) bench/snap_bench.py $(filter --quick,$(BENCH_ARGS)) || { rc=1; echo "make bench: bench/snap_bench.py failed" >&2; }; \
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
FUZZ_TARGETS := manifest ctl
FUZZ_FLAGS := -std=gnu11 -g -O1 -fno-omit-frame-pointer -D_GNU_SOURCE -I. \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	$(shell pkg-config --cflags fuse3 libxxhash 2>/dev/null)

.PHONY: fuzz fuzz-build fuzz-seeds
# Rewrites the committed seeds with mlfs's own encoder (after a format change).
fuzz-seeds: $(LIB)
	@mkdir -p build/fuzz tests/fuzz/seeds/manifest tests/fuzz/seeds/ctl
	$(Q)$(CC) $(CFLAGS) -o build/fuzz/seedgen tests/fuzz/seedgen.c $(LIB) $(LDLIBS)
	$(Q)build/fuzz/seedgen tests/fuzz/seeds/manifest tests/fuzz/seeds/ctl

fuzz-build: $(FUZZ_TARGETS:%=build/fuzz/fuzz_%)

build/fuzz/fuzz_manifest: tests/fuzz/fuzz_manifest.c fs/manifest.c fs/manifest.h
build/fuzz/fuzz_ctl: tests/fuzz/fuzz_ctl.c fs/ctl.c cache/log.c fs/ctl.h fs/mlfs.h
$(FUZZ_TARGETS:%=build/fuzz/fuzz_%):
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  FUZZ-CC $@")
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $(filter %.c,$^) -lxxhash -pthread

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
