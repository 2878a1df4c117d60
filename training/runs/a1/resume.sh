#!/usr/bin/env bash
# Resume the from-scratch run "a1" (see README.md beside this file).
#
#   training/runs/a1/resume.sh            # RUN defaults to ~/needle_runs/a1
#   RUN=/work/runs/a1 THREADS=1 training/runs/a1/resume.sh
#   EXTRA=--compile training/runs/a1/resume.sh   # torch.compile: ~6 % more tokens/s on one Zen 3 core
#
# A run folder that holds torch_state.pt (parameters, optimizer, step) resumes from it.
# Otherwise the folder is made from the files here: run.json and the tokenizer, the
# training data drawn again with its seed (deterministic, ~4 min), and the model from
# weights_fp16.pt (its step and token counts; the optimizer's moments start afresh).
# Steps 0-719 read mix seed 201, steps 720-2199 mix2 seed 202, steps 2200-2399 a first
# draw of mix3 (seed 203, 1-4 requests per corpus catalogue), steps 2400-3624 mix3 seed 204,
# steps 3625-4274 mix4 seed 205 (phrase values; names and values weighted from step 4150,
# run.json's role_weights), steps 4275-4599 mix5 seed 206 (requests as people say them);
# steps 4600-5243 mix6 seed 207 (more refusals that need the catalogue read; from step 5200
# in batches of 32,768 tokens at a held LR of 4.5e-4, run.json); from step 5244 the run reads
# mix7 seed 208 (chat-marker spellings in 12 % of the conversations) from its first batch
# (control.json's tokens_from_step).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
RUN=${RUN:-$HOME/needle_runs/a1}
THREADS=${THREADS:-1}
if [ ! -f "$RUN/tokens_mix7s208.npz" ]; then
    mkdir -p "$RUN"
    cp "$here/run.json" "$here/tokenizer.model" "$here/tokenizer.vocab" "$here/tokenizer.record" "$RUN/"
    python -m needle_cy.training.train add-data "$RUN" mix7s208 --version mix7 --examples 40000 --seed 208
    echo '{"tokens": "tokens_mix7s208.npz", "tokens_from_step": 5244}' > "$RUN/control.json"
fi
init=()
[ -f "$RUN/torch_state.pt" ] || init=(--init "$here/weights_fp16.pt")
export OMP_NUM_THREADS=$THREADS
exec python -m needle_cy.training.torch_train fit "$RUN" --device cpu --threads "$THREADS" "${init[@]}" ${EXTRA:-}
