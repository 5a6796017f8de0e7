"""Datasets: formats, validation messages, prompt truncation, the bundled prompt set."""

import datasets
import pytest

from distill.data import examples_from_dataset
from distill.data_files import BUNDLED_PROMPTS, load_dataset_spec
from distill.rendering import TextRenderer


def test_bundled_prompt_set_has_a_fixed_heldout_split():
    train = load_dataset_spec("bundled", "train", "dataset")
    heldout = load_dataset_spec("bundled", "heldout", "dataset")
    assert len(train) + len(heldout) >= 300 and len(heldout) == 40
    assert not set(train["id"]) & set(heldout["id"])
    categories = set(train["category"])
    assert len(categories) >= 5 and set(heldout["category"]) == categories
    assert BUNDLED_PROMPTS.is_file()


@pytest.mark.parametrize("bad, fix", [([{"prompt": "hi"}], "from_list"), (None, "from_pandas")])
def test_wrong_dataset_types_say_how_to_fix(bad, fix):
    if bad is None:
        import pandas  # a dependency of datasets
        bad = pandas.DataFrame({"prompt": ["hi"]})
    with pytest.raises(TypeError, match=fix):
        load_dataset_spec(bad, "train", "dataset")


def test_missing_prompt_column_and_empty_dataset():
    with pytest.raises(ValueError, match="'prompt' column"):
        examples_from_dataset(datasets.Dataset.from_list([{"text": "hi"}]), "dataset")
    with pytest.raises(ValueError, match="empty"):
        examples_from_dataset(datasets.Dataset.from_dict({"prompt": []}), "dataset")


@pytest.mark.parametrize(
    "messages, match",
    [
        ([{"role": "user"}], "malformed"),
        ([{"role": "robot", "content": "x"}], "unknown role"),
        ([{"role": "assistant", "content": "x"}], "only an assistant"),
    ],
)
def test_malformed_messages_name_the_row(messages, match):
    rows = [{"messages": [{"role": "user", "content": "fine"}]}, {"messages": messages}]
    with pytest.raises(ValueError, match=rf"^dataset row 1\b.*{match}"):
        examples_from_dataset(datasets.Dataset.from_list(rows), "dataset")


def test_messages_last_assistant_turn_is_the_completion():
    rows = [{"messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]}]
    (example,) = examples_from_dataset(datasets.Dataset.from_list(rows), "dataset")
    assert example.prompt == [{"role": "user", "content": "Q?"}] and example.completion == "A."
    rows = [{"prompt": [{"role": "user", "content": "Q?"}], "completion": [{"role": "assistant", "content": "B."}]}]
    (example,) = examples_from_dataset(datasets.Dataset.from_list(rows), "dataset")
    assert example.completion == "B."


def test_local_jsonl_file_and_missing_path(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    assert len(load_dataset_spec(str(path), "train", "dataset")) == 2
    with pytest.raises(ValueError, match="does not exist"):
        load_dataset_spec(str(tmp_path / "nope.jsonl"), "train", "dataset")


def test_long_prompts_keep_their_end(tokenizer):
    encoder = TextRenderer(tokenizer, max_prompt_length=12, max_new_tokens=5, eos_token_ids=[tokenizer.eos_token_id])
    long_prompt = [{"role": "user", "content": "word " * 50 + "final question?"}]
    ids, truncated = encoder.prompt_ids(long_prompt)
    full = tokenizer(encoder.render(long_prompt), add_special_tokens=False)["input_ids"]
    assert truncated and len(ids) == 12 and ids == full[-12:]
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    roomy = TextRenderer(tokenizer, max_prompt_length=64, max_new_tokens=5, eos_token_ids=[tokenizer.eos_token_id])
    short_ids, short_truncated = roomy.prompt_ids([{"role": "user", "content": "hi"}])
    assert not short_truncated and short_ids == tokenizer(roomy.render([{"role": "user", "content": "hi"}]))["input_ids"]
    completion = encoder.completion_ids("a b c d e f g h")
    assert len(completion) == 5
    assert encoder.completion_ids("ok")[-1] == tokenizer.eos_token_id
    cut = roomy.completion_ids("yes<|im_end|> and more after it")
    assert cut.count(tokenizer.eos_token_id) == 1 and cut[-1] == tokenizer.eos_token_id


def test_privileged_context_column_is_read_and_checked():
    rows = [{"prompt": "2+2?", "privileged_context": "The answer is 4."}, {"prompt": "3+3?"}]
    examples = examples_from_dataset(datasets.Dataset.from_list(rows), "dataset")
    assert [e.privileged_context for e in examples] == ["The answer is 4.", None]
    bad = datasets.Dataset.from_list([{"prompt": "a", "privileged_context": 1}, {"prompt": "b", "privileged_context": 2}])
    with pytest.raises(ValueError, match=r"dataset row 0: 'privileged_context' must be text or a list of content blocks, got int"):
        examples_from_dataset(bad, "dataset")
