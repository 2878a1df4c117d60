#!/usr/bin/env bash
# Resume the from-scratch run "a1" (see README.md beside this file).
#
#   training/runs/a1/resume.sh            # RUN defaults to ~/needle_runs/a1
#   RUN=/work/runs/a1 THREADS=1 training/runs/a1/resume.sh
#   EXTRA=--compile training/runs/a1/resume.sh   # torch.compile: ~6 % more tokens/s on one Zen 3 core
#
# A run folder that holds torch_state.pt (parameters, optimizer, step) resumes from it.
# Otherwise the folder is made from the files here: run.json and the tokenizer, the
# training data drawn again with its seed (deterministic, ~3 min), and the model from
# weights_fp16.pt (its step and token counts; the optimizer's moments start afresh).
# Steps 0-949 read mix seed 201; from step 950 the run reads mix2 seed 202.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
RUN=${RUN:-$HOME/needle_runs/a1}
THREADS=${THREADS:-1}
if [ ! -f "$RUN/tokens_mix2s202.npz" ]; then
    mkdir -p "$RUN"
    cp "$here/run.json" "$here/tokenizer.model" "$here/tokenizer.vocab" "$here/tokenizer.record" "$RUN/"
    python -m needle_cy.training.train add-data "$RUN" mix2s202 --version mix2 --examples 40000 --seed 202
    echo '{"tokens": "tokens_mix2s202.npz"}' > "$RUN/control.json"
fi
init=()
[ -f "$RUN/torch_state.pt" ] || init=(--init "$here/weights_fp16.pt")
export OMP_NUM_THREADS=$THREADS
exec python -m needle_cy.training.torch_train fit "$RUN" --device cpu --threads "$THREADS" "${init[@]}" ${EXTRA:-}
