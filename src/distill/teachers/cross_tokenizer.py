"""A teacher with another tokenizer (method gold): it renders its own prompts and aligns completions by bytes.

The student's completion ids are turned into text through the bytes each token spells (`distill.align`);
the teacher reads the conversation through its own chat template (its special tokens kept, the prompt cut
to `max_prompt_length` teacher tokens keeping its end) followed by that text in its own tokens, plus its
EOS when the student's completion ended with the student's EOS. Groups of tokens spelling the same bytes
are compared by ULD or hybrid ULD (`distill.losses.uld`); the EOS pair is a group of its own.

For sequence-level KD the teacher samples from its own prompt, and its completion comes back as student
ids: text through the teacher's token bytes (never a skip_special_tokens decode, which would drop the
EOS), re-encoded by the student tokenizer, the student's EOS appended exactly when the teacher's sample
ended with the teacher's EOS (also when pad == eos on either side), cut to max_new_tokens student tokens.
A teacher without an EOS id samples up to max_new_tokens, and no substitute stop token is invented.
When both sides have the same vocabulary, ids pass through unchanged both ways (one token per group): a text
round trip could re-tokenize differently at BPE boundaries.

A conversation (multi-turn rows, the tool-call loop's trajectories) is scored whole, once: the teacher renders its
prompt with its own template (the run's tools as that template shows them, an environment's observation), each of
the model's turns as the bytes the student wrote (its tool calls included, as text: the teacher scores what the
student wrote), and the environment's turns between them as the teacher's template renders their messages. Only
the model's turns are aligned: the environment's bytes, spelled differently by the two templates, are in no group.
A later piece of a conversation (the student's template re-renders its history) is scored with the teacher's own
rendering of the conversation before it (`Layout.history`) as its prompt. The teacher's template renders each
environment segment on its own, so it must preserve prefixes (refused at the first conversation otherwise).

The teacher's forward pass runs here (a model) or on a `distill serve-teacher` that sends its final hidden
states (`remote`, `teacher_payload: hidden`): the alignment, the group prefixes and the head are computed here
either way, from the teacher's tokenizer and head, so both give the same signal. A remote teacher only scores.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping

import torch
from torch import nn

from distill.align import (
    TokenBytes,
    align_groups,
    drop_prefix_space,
    encode_with_ends,
    paired_groups,
    text_and_ends,
)
from distill.batch import MicroBatch
from distill.conversations.layout import Layout
from distill.data import Example
from distill.generation import SamplingParams, generate_completions
from distill.generation.sample import Sample
from distill.losses import LogitHead
from distill.losses.uld import Alignment, ULDSettings, VocabularyMatch
from distill.models import eos_token_ids, logit_head
from distill.models.inputs import RowExtras, collate_extras
from distill.models.kinds import model_kind_of
from distill.no_grad import no_grad
from distill.settings.gold import GoldFields
from distill.signals import AlignedSignal
from distill.teachers.base import Teacher
from distill.teachers.hidden import backbone_hidden

if TYPE_CHECKING:
    from distill.config import DistillConfig
    from distill.rendering import EnvironmentTurns


class ByteBudget:
    """A transformers stopping criterion: a row stops once its generated tokens spell `budget` bytes.

    The student keeps at most max_new_tokens of its own tokens; each spells at most `max_plain_bytes`
    bytes, so a teacher sample longer than max_new_tokens x that many bytes is cut anyway: sampling past it
    is wasted (for a byte-level student, 96 tokens are 96 bytes, about 25 SmolLM2 tokens, not 96). Rows it
    stops are then filled with padding by generate, which must not be mistaken for an EOS when pad == eos:
    `stop_lengths` says where each row stopped, so the caller cuts there.
    """

    def __init__(self, token_bytes: TokenBytes, budget: int):
        self.lengths = torch.tensor([len(b) for b in token_bytes.table], dtype=torch.long)
        self.budget = budget
        self._stopped: torch.Tensor | None = None
        self._width = 0

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        if self._stopped is None:  # first call: one token generated after the (left-padded) prompts
            self._stopped = torch.full((input_ids.shape[0],), -1, dtype=torch.long)
            self._width = input_ids.shape[1] - 1
        generated = input_ids[:, self._width :].cpu()
        done = self.lengths[generated].sum(dim=1) >= self.budget
        self._stopped[done & (self._stopped < 0)] = generated.shape[1]
        return done.to(input_ids.device)

    def stop_lengths(self, rows: int) -> list[int | None]:
        """Per row of the one generate call this criterion served: the length it stopped at, or None."""
        if self._stopped is None:
            return [None] * rows
        return [int(v) if v >= 0 else None for v in self._stopped]


@dataclass
class MappedCompletion:
    """One completion on the teacher's side: its prompt and completion ids, and the aligned groups
    [(student completion positions, teacher completion positions)]."""

    prompt_ids: list[int]
    completion_ids: list[int]
    groups: list[tuple[list[int], list[int]]]
    extras: RowExtras = field(default_factory=dict)  # the teacher's own image inputs for its prompt (its processor's)


class CrossTokenizerTeacher(Teacher):
    """A teacher model whose tokenizer differs from the student's; scores into an `AlignedSignal`."""

    can_generate = True
    aligned = True  # its divergence is the aligned (ULD / hybrid) one, not a same-vocabulary KL
    frozen = True  # its weights never change during the run (`Teacher.frozen`)
    head: LogitHead  # always held: the model's, or the remote teacher's (fetched when it was checked)

    def __init__(self, model: nn.Module | None, tokenizer, student_tokenizer, student_eos_ids: list[int], max_prompt_length: int,
                 settings: ULDSettings, device: torch.device, remote=None, offered_tools: list[dict] | None = None,
                 template_kwargs: Mapping[str, Any] | None = None):
        """`model`: the teacher on this process; or None and `remote`, a checked `HiddenStateServerTeacher` of
        the teacher's vocabulary (its head held here). `offered_tools`: the run's tools' schemas, shown in the
        teacher's prompts as its template shows tools (rows with a `tools` column show their own);
        `template_kwargs`: its chat template's arguments (the run's `teacher_chat_template_kwargs`)."""
        self.student_bytes = TokenBytes.from_tokenizer(student_tokenizer, "student")
        self.teacher_bytes = TokenBytes.from_tokenizer(tokenizer, "teacher")
        self.model = model.eval().requires_grad_(False) if model is not None else None
        self.remote = remote
        self.can_generate = model is not None
        self.tokenizer, self.student_tokenizer = tokenizer, student_tokenizer
        self.vocab_size = len(tokenizer)
        if model is not None:
            rows = model.get_output_embeddings().weight.shape[0]
            if rows < self.vocab_size:
                raise ValueError(f"the teacher's lm_head has {rows} rows but its tokenizer has {self.vocab_size} tokens")
            self.head = logit_head(model, self.vocab_size)
        else:
            self.head = remote.head
        self.eos_ids = eos_token_ids(tokenizer, model)  # may be empty: such a teacher samples to max_new_tokens
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0)  # only ever under mask 0
        self.student_eos_ids = list(student_eos_ids)
        # The teacher's own kind renders its prompts: a vision-language teacher its images through its own processor.
        # (A teacher on a server renders as a text model: its kind is `causal_lm`.)
        renderer = model_kind_of(model).encoder(tokenizer, max_prompt_length, 1, self.eos_ids, model, template_kwargs)
        self.renderer = renderer.offering(offered_tools)
        self._environment: EnvironmentTurns | None = None
        self.settings = settings
        self.device = device
        # The same vocabulary on both sides (method gold with one tokenizer): ids pass through as they are, which
        # keeps every EOS and avoids the drift of a text round trip at BPE boundaries ("th" + "e" -> "the").
        self.same_vocabulary = tokenizer.get_vocab() == student_tokenizer.get_vocab()

    # ------------------------------------------------------------------------------------ mapping --
    def prompt_ids(self, example: Example, observation: str | None = None, history: tuple[dict, ...] = ()) -> list[int]:
        """The teacher's own rendering of the prompt (chat template, its tools, special tokens kept), end kept;
        `observation`: an environment's text after the last user message, as the student's prompt had it;
        `history`: a later piece's conversation after the prompt (`Layout.history`), as its template renders it."""
        return self.prompt_inputs(example, observation, history)[0]

    def prompt_inputs(self, example: Example, observation: str | None = None,
                      history: tuple[dict, ...] = ()) -> tuple[list[int], RowExtras]:
        """(`prompt_ids`, the teacher's image inputs for them): a row's images through the teacher's own processor,
        its image tokens expanded in its own ids."""
        if example.images:
            if self.model is None:
                raise ValueError(f"row {example.index} shows images: a cross-tokenizer teacher on a server does not take "
                                 "images yet; run the teacher in this process")
            encoded = self.renderer.row(replace(example, completion=None, turns=None))
            return encoded.prompt_ids, encoded.extras
        return self.renderer.prompt(example, observation=observation, history=history).ids, self.renderer.extras(example)

    def environment(self) -> EnvironmentTurns:
        """The teacher template's environment turns (made once; checked to preserve prefixes: each environment segment
        is rendered on its own, after the student's turn as the teacher's template shows it)."""
        if self._environment is None:
            if not self.eos_ids:
                raise ValueError("the teacher's tokenizer has no EOS token, so its template's turns cannot be told apart "
                                 "in a conversation; give it one (eos_token in its tokenizer config)")
            environment = self.renderer.environment_turns()
            if environment.problem is not None:
                raise ValueError(f"the teacher's chat template: {environment.problem}. A teacher with another tokenizer "
                                 "renders the environment's turns between the student's on its own, which needs a teacher "
                                 "template that preserves prefixes (e.g. save the teacher's tokenizer with such a template, "
                                 "or pass teacher_chat_template_kwargs that make it one)")
            self._environment = environment
        return self._environment

    def map_completion(self, example: Example, student_ids: list[int], layout: Layout | None = None) -> MappedCompletion:
        """The student's completion on the teacher's side, with the aligned groups of both tokenizations.

        A conversation (`layout`): each of the model's turns is mapped as a completion of its own, the environment's
        turns between them are rendered by the teacher's template from their messages (the student's environment ids
        are never mapped, so no group covers them); nothing after the last model turn is scored."""
        prompt, extras = self.prompt_inputs(example, None if layout is None else layout.observation,
                                            () if layout is None else layout.history)
        if layout is None:
            completion, groups = self._map_turn(student_ids)
            return MappedCompletion(prompt, completion, groups, extras)
        completion, groups = [], []
        spans = layout.spans()
        last_turn = max((k for k, (_, _, segment) in enumerate(spans) if segment.assistant), default=-1)
        for start, end, segment in spans[: last_turn + 1]:
            if not segment.assistant:
                completion.extend(self.environment().after_turn(list(segment.messages)))
                continue
            turn, turn_groups = self._map_turn(student_ids[start:end])
            groups.extend(([start + p for p in s], [len(completion) + q for q in t]) for s, t in turn_groups)
            completion.extend(turn)
        return MappedCompletion(prompt, completion, groups, extras)

    def _map_turn(self, student_ids: list[int]) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
        """One model turn (or a whole completion) in teacher ids, with its groups (positions within the turn)."""
        ended = bool(student_ids) and student_ids[-1] in self.student_eos_ids
        body = student_ids[:-1] if ended else student_ids
        if self.same_vocabulary:
            completion = list(body) + ([self.eos_ids[0]] if ended and self.eos_ids else [])
            return completion, [([k], [k]) for k in range(len(completion))]
        text, student_ends = drop_prefix_space(self.student_bytes, *text_and_ends(self.student_bytes, body))
        teacher_body, teacher_ends = encode_with_ends(self.tokenizer, self.teacher_bytes, text)
        student_groups, teacher_groups, count = align_groups(student_ends, teacher_ends)
        groups = paired_groups(student_groups, teacher_groups, count)
        completion = list(teacher_body)
        if ended and self.eos_ids:
            completion.append(self.eos_ids[0])
            groups.append(([len(body)], [len(teacher_body)]))
        return completion, groups

    def to_student(self, teacher_ids: list[int], hit_max: bool, max_new_tokens: int) -> tuple[list[int], bool]:
        """A teacher sample as student ids (EOS rules in the module docstring); (ids, stopped at max_new_tokens)."""
        ended = bool(teacher_ids) and teacher_ids[-1] in self.eos_ids
        body = teacher_ids[:-1] if ended else teacher_ids
        if self.same_vocabulary:
            return self._student_ids(list(body), ended, hit_max, max_new_tokens)
        # final=False holds back a character cut in half by max_new_tokens: it is not text yet.
        text = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(self.teacher_bytes.join(body), final=False)
        text = drop_prefix_space(self.teacher_bytes, text, [])[0]
        ids = self.student_tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        return self._student_ids(ids, ended, hit_max, max_new_tokens)

    def _student_ids(self, ids: list[int], ended: bool, hit_max: bool, max_new_tokens: int) -> tuple[list[int], bool]:
        """A completion body in student ids, ended as the teacher's sample was (module docstring)."""
        first_eos = next((k for k, token in enumerate(ids) if token in self.student_eos_ids), None)
        if first_eos is not None:  # the text spells the student's EOS: it ends there, as a sampled EOS would
            ids = ids[: first_eos + 1]
        elif ended:
            ids = ids + [self.student_eos_ids[0]]
        cut = len(ids) > max_new_tokens
        ids = ids[:max_new_tokens]
        stopped = bool(ids) and ids[-1] in self.student_eos_ids
        return ids, not stopped and (hit_max or cut)

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()

    def score_divergence(self, batch: MicroBatch, temperature: float) -> AlignedSignal:
        return self.score(batch, temperature, divergence_only=True)

    def completion_hidden(self, mapped: list[MappedCompletion]) -> list[torch.Tensor]:
        """Per row, the teacher's final hidden states (L, H) at the positions predicting its L completion tokens:
        from the model here, or from the server."""
        if self.remote is not None:
            counts = [len(m.completion_ids) for m in mapped]
            hidden = self.remote.hidden_states([m.prompt_ids + m.completion_ids for m in mapped if m.completion_ids],
                                               [len(m.prompt_ids) for m in mapped if m.completion_ids])
            return list(hidden.to(self.device).split(counts))
        lengths = [len(m.prompt_ids) + len(m.completion_ids) for m in mapped]
        input_ids = torch.full((len(mapped), max(lengths)), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, m in enumerate(mapped):
            input_ids[row, : lengths[row]] = torch.tensor(m.prompt_ids + m.completion_ids, dtype=torch.long)
            attention_mask[row, : lengths[row]] = 1
        extras = {name: value.to(self.device) for name, value in collate_extras([m.extras for m in mapped]).items()}
        hidden = backbone_hidden(self.model, input_ids.to(self.device), attention_mask.to(self.device), extras)
        return [hidden[row, len(m.prompt_ids) - 1 : lengths[row] - 1] for row, m in enumerate(mapped)]

    # ------------------------------------------------------------------------------ the protocol --
    def generate(self, prompts: list[list[int]], sampling: SamplingParams, batch_size: int | None = None,
                 examples: list[Example] | None = None, seeds: list[int] | None = None,
                 extras=None, seeded_rows: bool = False) -> list[Sample]:
        """Sample from the teacher's own prompts (`examples`; the student's `prompts` and `extras` are not its inputs)."""
        if examples is None or len(examples) != len(prompts):
            raise ValueError("a cross-tokenizer teacher renders its own prompts: generate needs the examples")
        from transformers import StoppingCriteriaList

        inputs = [self.prompt_inputs(e) for e in examples]
        teacher_prompts, teacher_extras = [ids for ids, _ in inputs], [extras for _, extras in inputs]
        budget_bytes = sampling.max_new_tokens * self.student_bytes.max_plain_bytes
        size = batch_size or max(len(teacher_prompts), 1)
        results = []
        for start in range(0, len(teacher_prompts), size):  # one generate call per criterion
            chunk = teacher_prompts[start : start + size]
            budget = ByteBudget(self.teacher_bytes, budget_bytes)
            outputs = generate_completions(self.model, chunk, sampling, self.eos_ids, self.pad_id, self.device,
                                           stopping_criteria=StoppingCriteriaList([budget]),
                                           vocab_size=len(self.teacher_bytes.table),
                                           seeds=None if seeds is None else seeds[start : start + size],
                                           extras=teacher_extras[start : start + size], seeded_rows=seeded_rows)
            for sample, stopped_at in zip(outputs, budget.stop_lengths(len(chunk)), strict=True):
                ids = sample.ids
                if stopped_at is not None and len(ids) > stopped_at:  # what follows a budget stop is padding, not an EOS
                    ids = ids[:stopped_at]
                student_ids, hit_max = self.to_student(ids, sample.hit_max or stopped_at is not None, sampling.max_new_tokens)
                results.append(Sample(student_ids, hit_max))
        return results

    @no_grad
    def score(self, batch: MicroBatch, temperature: float, divergence_only: bool = False) -> AlignedSignal:
        """The aligned signal of a micro-batch; `divergence_only` drops the cross-entropy term (evaluation)."""
        mapped = []
        for row, completion in enumerate(batch.completions):
            if completion.example is None:
                raise ValueError("a cross-tokenizer teacher needs each completion's dataset example (Completion.example)")
            if int(batch.completion_mask[row].sum()) != completion.num_trained:
                raise ValueError("the micro-batch's completion mask does not match its completions")
            mapped.append(self.map_completion(completion.example, completion.completion_ids, completion.layout))

        num_rows = batch.num_completion_tokens
        row_group = torch.full((num_rows,), -1, dtype=torch.long)
        row_last = torch.zeros(num_rows, dtype=torch.bool)
        weights: list[float] = []
        last_at, inner_at, inner_group, inner_target = [], [], [], []
        offset = 0
        for row, (m, completion) in enumerate(zip(mapped, batch.completions)):
            # A completion token's row among the batch's N trained positions. A group holding an untrained
            # token (a skipped one, a hole in the mask) is left out whole: its trained tokens get no loss.
            at = {k: offset + rank for rank, k in enumerate(completion.trained_indices())}
            for student_positions, teacher_positions in m.groups:  # row k of completion_hidden predicts token k
                if any(p not in at for p in student_positions):
                    continue
                group = len(weights)
                row_group[[at[p] for p in student_positions]] = group
                row_last[at[student_positions[-1]]] = True
                weights.append(float(len(student_positions)))
                last_at.append((row, teacher_positions[-1]))
                for k in teacher_positions[:-1]:
                    inner_at.append((row, k))
                    inner_group.append(group)
                    inner_target.append(m.completion_ids[k])
            offset += len(at)

        groups = len(weights)
        hidden_size = self.head.weight.shape[1]
        teacher_hidden = torch.zeros(groups, hidden_size, dtype=self.head.weight.dtype, device=self.device)
        log_prefix = torch.zeros(groups, dtype=torch.float32, device=self.device)
        if groups:
            hidden = self.completion_hidden(mapped)
            teacher_hidden = torch.stack([hidden[row][k] for row, k in last_at]).to(self.head.weight.dtype)
            if inner_at:
                logits = self.head.full_logits(torch.stack([hidden[row][k] for row, k in inner_at])) / temperature
                targets = torch.tensor(inner_target, dtype=torch.long, device=self.device)
                picked = torch.log_softmax(logits, dim=-1).gather(1, targets.unsqueeze(1)).squeeze(1)
                log_prefix.index_add_(0, torch.tensor(inner_group, dtype=torch.long, device=self.device), picked)
        settings = replace(self.settings, crossentropy_weight=0.0) if divergence_only else self.settings
        alignment = Alignment(row_group, row_last, torch.tensor(weights, dtype=torch.float32))
        return AlignedSignal(alignment, teacher_hidden, log_prefix, self.head, settings, temperature)


def uld_settings(config: DistillConfig, student_tokenizer, teacher_tokenizer, student_vocab: int, teacher_vocab: int) -> ULDSettings:
    """The ULD variant a gold config asks for; the hybrid's adaptive weights follow the vocabulary overlap.

    Adaptive (both hybrid weights None): w_matched = matched tokens / teacher vocabulary, w_unmatched = 1 - w_matched.
    """
    gold = GoldFields.of(config)
    if not gold.uld_use_hybrid_loss:
        return ULDSettings(None, 0.0, 1.0, gold.uld_crossentropy_weight)
    match = VocabularyMatch.from_tokenizers(student_tokenizer, teacher_tokenizer, student_vocab, teacher_vocab)
    if match.size == 0:
        raise ValueError("uld_use_hybrid_loss: the student and teacher vocabularies share no token string, so the hybrid "
                         "loss has nothing to match; set uld_use_hybrid_loss: false (plain ULD)")
    if gold.uld_hybrid_matched_weight is None:
        matched = match.size / teacher_vocab
        return ULDSettings(match, matched, 1.0 - matched, gold.uld_crossentropy_weight)
    assert gold.uld_hybrid_unmatched_weight is not None  # validation asks for both or neither
    return ULDSettings(match, gold.uld_hybrid_matched_weight, gold.uld_hybrid_unmatched_weight, gold.uld_crossentropy_weight)
