"""Why the GPU image serves the bundle's own OpenAI frontend, not Triton's (python/openai at the
pinned Triton, facts in specdec/build/upstream.py): each reason checked against the ensemble's
contract and the profiles, so a change on either side that removes a reason fails here, and
the choice is made again."""

from __future__ import annotations

from specdec.build import upstream
from specdec.config import load_profile
from specdec.contract import ENSEMBLE_INPUTS
from specdec.openai.protocol import EXTRA_FIELDS


def test_triton_frontend_would_template_a_chat_twice():
    """It templates a chat itself and sends text_input without apply_chat_template; the profiles
    apply the chat template in preprocessing by default."""
    assert "apply_chat_template" not in upstream.TRITON_OPENAI_TRTLLM_INPUTS
    assert load_profile().chat_template
    assert upstream.TRITON_OPENAI_TEMPLATES_WHERE.path.endswith("triton_engine.py")


def test_triton_frontend_sends_inputs_the_ensemble_does_not_serve():
    """Penalties change the model's distribution, which speculative verification must keep."""
    assert set(upstream.TRITON_OPENAI_TRTLLM_INPUTS) - set(ENSEMBLE_INPUTS) == {
        "frequency_penalty",
        "presence_penalty",
    }


def test_triton_frontend_reports_no_usage_and_no_speculation_for_an_ensemble():
    assert upstream.TRITON_OPENAI_USAGE_BACKENDS == ("vllm",)
    speculation = {"num_draft_tokens", "draft_method"}
    assert speculation <= set(EXTRA_FIELDS) and not speculation & set(upstream.TRITON_OPENAI_TRTLLM_INPUTS)


def test_every_fact_names_the_pinned_triton():
    wheres = [v for k, v in vars(upstream).items() if k.startswith("TRITON_OPENAI_") and k.endswith("_WHERE")]
    assert len(wheres) == 6
    assert all(w.ref == upstream.TRITON_SERVER_TAG == "v2.61.0" and w.repo == upstream.SERVER_REPO for w in wheres)
