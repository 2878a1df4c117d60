#!/usr/bin/env bash
# A prepared GPU training run for the default model: minutes on a lent
# accelerator instead of days on two CPU cores.
#
#   tools/device_train.sh prepare [RUN]     # here, on the CPU machine (~10 min of CPU)
#   tools/device_train.sh train   [RUN]     # there, on the GPU machine (time-bounded)
#   tools/device_train.sh smoke   [RUN]     # here: the train step on the CPU, 3 steps
#
# prepare: a run folder (default .device/run, which .git/info/exclude must ignore)
#   with run.json (geometry below), a tokenizer record, and the training data as one
#   compressed token file (tokens_gpu.npz, uint16 ids: ~12-14 MB per 40k mix
#   conversations).  Two ways:
#   - TOKENIZER=mix MIX_SEEDS="201 202 203 204": a tokenizer retrained on mix text
#     (VOCAB pieces, default 4096; `train tokenizer`, 15-24 % fewer tokens per mix
#     conversation than the shipped one), then 40k mix conversations per seed
#     tokenized with it (`train add-data`, ~2-5 min each here), merged;
#   - otherwise the shipped tokenizer, and TOKEN_FILES names mix token files made
#     with it (`python -m needle_cy.training.train add-data RUN NAME --version mix
#     --examples 40000 --seed S`; seeds 201-204 were used), merged.  Everything the GPU run needs travels in that folder: the
#   machine there has PyTorch and NumPy but no jsonschema, and the run needs neither
#   the Cython extensions nor the corpus.
#   - FROM=training/runs/a1 MIX_SEEDS="206 207 208" [MIX_VERSION=mix4]: go on with a
#     CPU run on the GPU: its run.json and tokenizer, its weights_fp16.pt as the start
#     (fresh optimizer moments, the LR warmed up again), conversations of MIX_VERSION
#     tokenized with its tokenizer; batches of 64k tokens.  `train` also writes
#     $OUT/weights_fp16.pt, which the CPU run resumes from (resume.sh with it in place).
# train: PyTorch trainer (needle_cy.training.torch_train) on CUDA in bf16 autocast,
#   from scratch, with --time-budget so the schedule (warmup, stable, decay over the
#   last 20 %) ends inside BUDGET seconds; then exports $OUT/model.cact (4-bit CQ)
#   and copies the log.  Call it through the device tool with `carry: [".device"]`
#   and a timeout_s of BUDGET + ~120 s.  Back here: evaluate with
#   `python -m needle_cy.eval --data ../shared/eval/unseen_dev.jsonl --model model.cact`.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-}
RUN=${2:-.device/run}
BUDGET=${BUDGET:-420}
OUT=${OUT:-$RUN/out}
PY=${PYTHON:-python3}

case "$MODE" in
prepare)
    if [ -n "${FROM:-}" ]; then
        : "${MIX_SEEDS:?set MIX_SEEDS to the mix seeds to draw (space separated)}"
        mkdir -p "$RUN"
        cp "$FROM/run.json" "$FROM/tokenizer.model" "$FROM/tokenizer.vocab" "$FROM/tokenizer.record" "$RUN/"
        cp "$FROM/weights_fp16.pt" "$RUN/init_fp16.pt"
        HYPER=${HYPER:-'{"tokens_per_batch": 65536, "peak_lr": 0.002, "warmup": 60, "checkpoint_every": 100, "log_every": 10, "snapshot_every": 0}'}
        $PY - "$RUN" "$HYPER" "${MIX_VERSION:-mix4}" "${EXAMPLES:-40000}" $MIX_SEEDS <<'PY'
import json, os, sys
import torch
from needle_cy.training import train
run_dir, hyper, version, examples, seeds = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5:]
path = os.path.join(run_dir, "run.json")
run = json.load(open(path))
run["hyper"].update(hyper)
json.dump(run, open(path, "w"), indent=1)
for seed in seeds:
    train.add_data(run_dir, f"{version}s{seed}", examples, int(seed), version)
files = [os.path.join(run_dir, f"tokens_{version}s{seed}.npz") for seed in seeds]
train.merge_tokens(files, os.path.join(run_dir, "tokens_gpu.npz"))
for seed in seeds:
    for name in (f"tokens_{version}s{seed}.npz", f"data_{version}s{seed}.jsonl"):
        os.remove(os.path.join(run_dir, name))
start = int(torch.load(os.path.join(run_dir, "init_fp16.pt"), map_location="cpu", weights_only=False)["step"])
json.dump({"tokens": "tokens_gpu.npz", "tokens_from_step": start}, open(os.path.join(run_dir, "control.json"), "w"))
print("prepared", run_dir, "from step", start, os.path.getsize(os.path.join(run_dir, "tokens_gpu.npz")) / 1e6, "MB of tokens")
PY
        exit 0
    fi
    TOKENIZER=${TOKENIZER:-shipped}
    if [ "$TOKENIZER" = mix ]; then
        : "${MIX_SEEDS:?set MIX_SEEDS to the mix seeds to draw (space separated)}"
    else
        : "${TOKEN_FILES:?set TOKEN_FILES to the mix token files to merge (space separated)}"
    fi
    mkdir -p "$RUN"
    # geometry: the shipped d_model 256 at twice its depth (first call stays under the
    # 150 ms target on 2 cores: ~2x the shipped model's 51 ms); batches of 64k tokens
    GEOMETRY=${GEOMETRY:-'{"num_layers": 8, "global_layers": [1, 3, 5, 7], "engram_layers": [0, 4]}'}
    HYPER=${HYPER:-'{"peak_lr": 0.002, "warmup": 150, "tokens_per_batch": 65536, "buckets": [384, 512, 640, 768, 1024], "checkpoint_every": 200, "log_every": 20, "seed": 23, "total_steps": 4000, "decay_steps": 800}'}
    $PY - "$RUN" "$GEOMETRY" "$HYPER" "$TOKENIZER" "${VOCAB:-4096}" "${MIX_SEEDS:-}" ${TOKEN_FILES:-} <<'PY'
import json, os, sys
from needle_cy.training import train
run_dir, geometry, hyper = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
tokenizer, vocab, seeds, files = sys.argv[4], int(sys.argv[5]), sys.argv[6].split(), sys.argv[7:]
train.warm_start(run_dir, "needle_cy/models/default.cact", params=False, **hyper)
with open(os.path.join(run_dir, "run.json")) as handle:
    run = json.load(handle)
run["model"].update(geometry)
run.pop("warm_start", None)                 # from scratch: at most the tokenizer is the shipped one
with open(os.path.join(run_dir, "run.json"), "w") as handle:
    json.dump(run, handle, indent=1)
for stale in ("tokenizer.model", "tokenizer.vocab"):  # an earlier prepare's; it would win over the record
    if os.path.exists(os.path.join(run_dir, stale)):
        os.remove(os.path.join(run_dir, stale))
if tokenizer == "mix":
    train.retrain_tokenizer(run_dir, vocab_size=vocab, source="mix")
    for seed in seeds:
        train.add_data(run_dir, f"mix{seed}", 40000, int(seed), "mix")
    files = [os.path.join(run_dir, f"tokens_mix{seed}.npz") for seed in seeds]
train.merge_tokens(files, os.path.join(run_dir, "tokens_gpu.npz"))
if tokenizer == "mix":                      # the GPU machine needs only the merged file
    for seed in seeds:
        for name in (f"tokens_mix{seed}.npz", f"data_mix{seed}.jsonl"):
            os.remove(os.path.join(run_dir, name))
with open(os.path.join(run_dir, "control.json"), "w") as handle:
    json.dump({"tokens": "tokens_gpu.npz"}, handle)
print("prepared", run_dir, os.path.getsize(os.path.join(run_dir, "tokens_gpu.npz")) / 1e6, "MB of tokens")
PY
    ;;
train|smoke)
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    mkdir -p "$OUT"
    if [ "$MODE" = smoke ]; then
        rm -rf "$RUN/smoke" && mkdir -p "$RUN/smoke"
        cp "$RUN"/run.json "$RUN"/tokenizer.record "$RUN"/tokens_gpu.npz "$RUN"/control.json "$RUN/smoke/"
        [ -f "$RUN/init_fp16.pt" ] && cp "$RUN/init_fp16.pt" "$RUN/smoke/"
        $PY - "$RUN/smoke" <<'PY'
import json, sys
path = sys.argv[1] + "/run.json"
run = json.load(open(path))
run["hyper"].update(tokens_per_batch=2048, buckets=[1024], log_every=1)
json.dump(run, open(path, "w"))
PY
        init=()
        [ -f "$RUN/smoke/init_fp16.pt" ] && init=(--init "$RUN/smoke/init_fp16.pt")
        $PY -m needle_cy.training.torch_train fit "$RUN/smoke" --steps 3 --device cpu "${init[@]}"
        $PY -m needle_cy.training.torch_train export "$RUN/smoke" "$OUT/smoke.cact" --bits 4
        exit 0
    fi
    nvidia-smi --query-gpu=name,memory.total --format=csv || true
    init=()
    [ -f "$RUN/init_fp16.pt" ] && [ ! -f "$RUN/torch_state.pt" ] && init=(--init "$RUN/init_fp16.pt")
    $PY -m needle_cy.training.torch_train fit "$RUN" --device cuda --precision bf16 --time-budget "$BUDGET" "${init[@]}"
    $PY -m needle_cy.training.torch_train export "$RUN" "$OUT/model.cact" --bits 4
    cp "$RUN/log.jsonl" "$RUN/run.json" "$RUN/control.json" "$OUT/"
    [ -f "$RUN/weights_fp16.pt" ] && cp "$RUN/weights_fp16.pt" "$OUT/"
    ;;
*)
    sed -n '2,24p' "$0"
    exit 2
    ;;
esac
