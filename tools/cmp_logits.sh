#!/usr/bin/env bash
# cmp_logits.sh OLD_BIN [NEW_BIN] - the --dump-logits of a fixed set of runs,
# byte for byte, from two builds (a refactor's proof that nothing moved):
# the tiny fixture, a 2,048-id prompt on the default model at several
# budgets and batch widths, a streamed trunk, one thread, drafts (ngram and
# the draft model), and under `mpirun -np 2` when the build has MPI.
# Prints "same NAME" or "DIFF NAME" per run; exits 1 on any difference.
# Build the old one in a worktree: git worktree add /tmp/old REV && make -C /tmp/old build/deltafin
set -u
cd "$(dirname "$0")/.."
OLD=${1:?usage: tools/cmp_logits.sh OLD_BIN [NEW_BIN]} NEW=${2:-build/deltafin}
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
node -e 'console.log(Array.from({length:2048},(_,i)=>(i*7919+31)%3800+3).join(","))' > "$D/ids.txt"
fail=0
run() { # NAME LAUNCHER... -- ARGS...
    local name=$1; shift
    local pre=()
    while [ "$1" != "--" ]; do pre+=("$1"); shift; done; shift
    for b in OLD NEW; do "${pre[@]}" "${!b}" run "$@" --dump-logits "$D/$name.$b" >/dev/null 2>"$D/$name.$b.err"; done
    if [ -s "$D/$name.NEW" ] && cmp -s "$D/$name.OLD" "$D/$name.NEW"; then echo "same $name ($(stat -c %s "$D/$name.NEW") bytes)"
    else echo "DIFF $name"; tail -2 "$D/$name.NEW.err"; fail=1; fi
}
run fixture -- --model testdata/k3-tiny-a/checkpoint --prompt-ids 1,2,3,4,5,6,7,8,9,10 --max-new 8
run prompt-2048 -- --model models/k3-mini --prompt-ids @"$D/ids.txt" --max-new 4
run prompt-2048-cache120K-batch512 -- --model models/k3-mini --prompt-ids @"$D/ids.txt" --max-new 4 --expert-cache 120K --batch 512
run prompt-2048-mem64M -- --model models/k3-mini --prompt-ids @"$D/ids.txt" --max-new 4 --mem 64M
run prompt-2048-trunk-streamed -- --model models/k3-mini --prompt-ids @"$D/ids.txt" --max-new 4 --trunk-stream on --expert-cache 200K
run prompt-2048-threads1-batch64 -- --model models/k3-mini --prompt-ids @"$D/ids.txt" --max-new 4 --threads 1 --batch 64
run drafts-ngram -- --model models/k3-mini --prompt-ids @"$D/ids.txt" --max-new 24 --draft ngram
run drafts-model -- --model models/k3-mini --prompt-ids 5,6,7,8,9 --max-new 24 --draft model:models/k3-mini-draft
if command -v mpirun >/dev/null && ldd "$NEW" | grep libmpi >/dev/null; then
    MPI=(mpirun --oversubscribe -np 2)
    [ "$(id -u)" = 0 ] && MPI=(mpirun --allow-run-as-root --oversubscribe -np 2)
    run mpi-np2 "${MPI[@]}" -- --model models/k3-mini --prompt-ids @"$D/ids.txt" --max-new 4 --expert-cache 120K
else
    echo "skip mpi-np2 (no mpirun, or the build has no MPI)"
fi
exit $fail
