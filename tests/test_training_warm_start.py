"""A warm start reads an archive back into the official JAX parameter tree exactly
(needle_cy.training.train.params_from_archive): the JAX forward on those parameters
equals the engine's float numerics on the archive.  Needs the ``train`` extra (jax and
cactus-needle); without it the test skips and says why."""
import numpy as np
import pytest

pytest.importorskip("jax", reason="the train extra (jax, cactus-needle) is not installed")
pytest.importorskip("needle.model.architecture", reason="cactus-needle[train] is not installed")

from pathlib import Path

ARCHIVE = Path(__file__).resolve().parent.parent / "needle_cy" / "models" / "default.cact"


def test_params_from_archive_reproduce_the_engine_float_logits(tmp_path):
    import jax
    import jax.numpy as jnp
    from needle.model.architecture import SimpleAttentionNetwork

    from needle_cy.model import Model
    from needle_cy.tokenizer import Tokenizer
    from needle_cy.training import train

    train.warm_start(str(tmp_path), str(ARCHIVE))
    run = train.load_run(str(tmp_path))
    state = train.load_state(str(tmp_path))
    assert state["step"] == 0 and state["opt_state"] is None
    assert (tmp_path / "tokenizer.record").read_bytes()
    tok = Tokenizer.from_archive(str(ARCHIVE))
    ids = [2] + list(tok.encode("<|im_start|>user\n<tools>[]</tools>\nlock the front door"
                                "<|im_end|>\n<|im_start|>assistant\n", allowed_special="all"))
    net = SimpleAttentionNetwork(train.transformer_config(run))
    logits = net.apply({"params": jax.tree.map(jnp.asarray, state["params"])},
                       jnp.asarray([ids], jnp.int32))
    ours = np.asarray(logits)[0, -1]
    engine = np.asarray(Model.load(str(ARCHIVE), numerics="float").prefill(ids))
    assert np.abs(ours - engine).max() <= 1e-4 * np.abs(engine).max()
    # the run's tokenizer is the archive's record, encoding as the engine does
    sp = train.run_tokenizer(str(tmp_path))
    assert sp.encode("lock the front door") == list(tok.encode("lock the front door"))
    assert sp.id_to_piece(sp.piece_to_id("<tool_call>")) == "<tool_call>"
    # rendered training text writes its markers as text: the run encodes them as markers
    assert sp.encode("<tool_call>[]") == list(tok.encode("<tool_call>[]", allowed_special="all"))
    assert sp.encode("<tool_call>[]")[1] == tok.marker_id("<tool_call>")
