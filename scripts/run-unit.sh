#!/bin/sh
# Run each C unit test program; each prints "N passed, N failed" as its last line.
# Prints the total as the last line and fails if any program failed or crashed.
set -u
tp=0; tf=0; bad=0
for t in "$@"; do
	out=$("$t" 2>&1); rc=$?
	printf '%s\n' "$out" | sed "s|^|$(basename "$t"): |"
	line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
	if [ -z "$line" ]; then
		echo "$(basename "$t"): exited $rc without a summary line"; bad=1; tf=$((tf + 1)); continue
	fi
	p=${line%% passed*}; f=${line#*passed, }; f=${f%% failed*}
	tp=$((tp + p)); tf=$((tf + f))
	[ "$rc" = 0 ] || bad=1
done
echo "unit: $tp passed, $tf failed"
[ "$tf" = 0 ] && [ "$bad" = 0 ]
