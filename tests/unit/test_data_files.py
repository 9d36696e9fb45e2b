"""Which files a data source reads, and as what (found by a new user with their own data):
hidden folders, compressed and CSV records, ``save_to_disk`` folders, ``np.save`` token
arrays, a custom dataset's ``path`` argument. Each read back from the token cache it writes."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from dtrain_cli.config.schema import DataConfig
from dtrain_cli.corpus.custom import build_custom
from dtrain_cli.corpus.hf import prepare_hf
from dtrain_cli.corpus.prepare import prepare_corpus
from dtrain_cli.errors import ConfigError

RECORDS = [{"text": f"record {i}: the quick brown fox"} for i in range(40)]
JOINED = "\n\n".join(r["text"] for r in RECORDS).encode()  # byte-level: a blank line between


def _tokens(paths: dict, dtype: str = "uint16") -> np.ndarray:
    return np.concatenate([np.fromfile(paths[s], dtype=dtype) for s in ("train", "val")])


def _plan_errors(*args: str) -> list[str]:
    result = CliRunner().invoke(app, ["plan", "recipe=gpt_tiny", *args])
    return [line for line in result.output.splitlines() if line.startswith("error:")]


def test_a_text_folder_skips_hidden_folders(tmp_path):
    """A repository's .git objects (compressed blobs) were 84% of a user's corpus."""
    repo = tmp_path / "repo"
    (repo / ".git" / "objects").mkdir(parents=True)
    (repo / ".git" / "objects" / "ab12").write_bytes(bytes(range(256)) * 40)
    (repo / "docs").mkdir()
    (repo / "docs" / "b.txt").write_text("second")
    (repo / "a.txt").write_text("first")
    data = DataConfig(source="text", path=str(repo), cache_dir=str(tmp_path / "c"))
    assert bytes(_tokens(prepare_corpus(data)).astype(np.uint8)) == b"first\n\nsecond"
    only_hidden = tmp_path / "only_hidden"
    (only_hidden / ".cache").mkdir(parents=True)
    (only_hidden / ".cache" / "x.txt").write_text("x")
    (line,) = _plan_errors("data=text", f"data.path={only_hidden}")
    assert "no files in it (hidden ones, and those in hidden folders, are not read)" in line


def test_compressed_and_csv_records_are_read_as_records(tmp_path):
    """corpus.jsonl.gz trained on the raw bytes of its JSON (an unknown extension was read
    as text); a .csv the same."""
    gz = tmp_path / "corpus.jsonl.gz"
    gz.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in RECORDS).encode()))
    csv = tmp_path / "corpus.csv"
    csv.write_text("id,text\n" + "".join(f"{i},{r['text']}\n" for i, r in enumerate(RECORDS)))
    for path in (gz, csv):
        data = DataConfig(source="hf", path=str(path), val_fraction=0.1)
        assert bytes(_tokens(prepare_hf(data, tmp_path / "c", 256)).astype(np.uint8)) == JOINED
        assert _plan_errors("data=hf", f"data.path={path}") == []


def test_a_file_of_no_known_format_is_refused_with_the_formats(tmp_path):
    odd = tmp_path / "corpus.dat"
    odd.write_text("id,text\n1,hello\n")
    (line,) = _plan_errors("data=hf", f"data.path={odd}")
    assert line == (
        f"error: data.path={odd}: not a .jsonl/.json/.parquet/.csv/.txt file (or one "
        "compressed: .gz/.bz2/.xz/.zst); set data.format=json|parquet|csv|text to say how to "
        "read it"
    )
    assert _plan_errors("data=hf", f"data.path={odd}", "data.format=csv") == []


def test_a_save_to_disk_folder_is_loaded_with_its_validation_split(tmp_path):
    """Its state.json and dataset_info.json were read as records (a 100-line datasets
    traceback at launch, nothing at plan)."""
    import datasets

    train = datasets.Dataset.from_list(RECORDS)
    val = datasets.Dataset.from_list([{"text": "held out"}])
    train.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": train, "validation": val}).save_to_disk(str(tmp_path / "two"))
    datasets.DatasetDict({"test": val}).save_to_disk(str(tmp_path / "no_train"))
    one = prepare_hf(DataConfig(source="hf", path=str(tmp_path / "one")), tmp_path / "c", 256)
    assert bytes(_tokens(one).astype(np.uint8)) == JOINED
    two = prepare_hf(DataConfig(source="hf", path=str(tmp_path / "two")), tmp_path / "c", 256)
    assert bytes(np.fromfile(two["train"], dtype=np.uint16).astype(np.uint8)) == JOINED
    assert bytes(np.fromfile(two["val"], dtype=np.uint16).astype(np.uint8)) == b"held out"
    assert _plan_errors("data=hf", f"data.path={tmp_path / 'two'}") == []
    (line,) = _plan_errors("data=hf", f"data.path={tmp_path / 'two'}", "data.text_field=body")
    assert line.endswith(f"not a column of {tmp_path / 'two'} (columns: text)")
    (line,) = _plan_errors("data=hf", f"data.path={tmp_path / 'no_train'}")
    assert "a saved DatasetDict without a train split (splits: test)" in line
    # Dataset.train_test_split's names: its test split validates (it was left unread)
    train.train_test_split(test_size=0.25, shuffle=False).save_to_disk(str(tmp_path / "split"))
    split = prepare_hf(DataConfig(source="hf", path=str(tmp_path / "split")), tmp_path / "c", 256)
    held = "\n\n".join(r["text"] for r in RECORDS[30:]).encode()
    assert bytes(np.fromfile(split["val"], dtype=np.uint16).astype(np.uint8)) == held


def test_an_npy_token_file_is_read_by_numpy_not_as_raw_ids(tmp_path):
    """np.save's header was read as token ids (and the error named the cache's train.bin)."""
    ids = (np.arange(3000) * 7) % 256
    np.save(tmp_path / "tok.npy", ids.astype(np.int64))
    data = DataConfig(source="tokens", path=str(tmp_path / "tok.npy"), cache_dir=str(tmp_path))
    assert _tokens(prepare_corpus(data)).tolist() == ids.tolist()
    np.save(tmp_path / "big.npy", np.arange(3000, dtype=np.int64) + 70_000)
    big = DataConfig(source="tokens", path=str(tmp_path / "big.npy"), cache_dir=str(tmp_path))
    with pytest.raises(ConfigError) as e:
        prepare_corpus(big)
    assert e.value.problems == [
        f"data.path={tmp_path / 'big.npy'}: ids up to 72999 do not fit "
        "data.token_dtype=uint16; set data.token_dtype=uint32"
    ]
    big.token_dtype = "uint32"
    assert _tokens(prepare_corpus(big), "uint32").max() == 72_999
    np.save(tmp_path / "two.npy", np.zeros((2, 3), dtype=np.int64))
    two = DataConfig(source="tokens", path=str(tmp_path / "two.npy"), cache_dir=str(tmp_path))
    with pytest.raises(ConfigError) as e:
        prepare_corpus(two)
    assert "a 2-D int64 array; token files hold one 1-D array" in e.value.problems[0]


def test_one_token_file_is_split_again_when_the_split_changes(tmp_path):
    """The cache was keyed by the file alone: data.val_fraction=0.5 gave the 0.1 split."""
    (np.arange(1000, dtype=np.uint16) % 256).tofile(tmp_path / "all.bin")
    sizes = []
    for fraction in (0.1, 0.5):
        data = DataConfig(source="tokens", path=str(tmp_path / "all.bin"), val_fraction=fraction)
        data.cache_dir = str(tmp_path / "c")
        sizes.append(len(np.fromfile(prepare_corpus(data)["val"], dtype=np.uint16)))
    assert sizes == [100, 500]


def test_a_custom_dataset_taking_path_gets_data_path(tmp_path):
    """data.path=DIR was refused for data=custom while the dataset's error said it takes
    data.path; a dataset argument named path now gets it."""
    folder = tmp_path / "ds"
    folder.mkdir()
    data = DataConfig(source="custom", path=str(folder), val_fraction=0.25)
    data._target_ = "tests.own_data.FolderPairs"
    built = build_custom(data)
    assert built["train"].dataset.folder == str(folder) and len(built["train"]) == 6
    assert _plan_errors("data=custom", "data._target_=tests.own_data.FolderPairs",
                        f"data.path={folder}") == []  # fmt: skip
    (line,) = _plan_errors("data=custom", "data._target_=tests.own_data.Pairs", "data.path=x")
    assert "Pairs() got an unexpected keyword argument 'path'" in line


def test_a_tokenizer_without_an_end_of_text_token_is_warned(tmp_path, hf_files):
    """Records were joined with nothing between them, silently (the cache's token count was
    the records' sum)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "the": 1, "fox": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    corpus, with_eos, vocab = hf_files
    args = ["plan", "recipe=gpt_tiny", "data=hf", f"data.path={corpus}"]
    args.append(f"model.vocab_size={vocab}")
    without = CliRunner().invoke(app, [*args, f"data.tokenizer={tmp_path / 'tok'}"])
    assert without.exit_code == 0, without.output
    said = " ".join(without.output.split())
    assert f"data.tokenizer={tmp_path / 'tok'}: no end-of-text token" in said
    with_one = CliRunner().invoke(app, [*args, f"data.tokenizer={with_eos}"])
    assert with_one.exit_code == 0 and "no end-of-text token" not in with_one.output


@pytest.mark.parametrize("sizes", [[1000], [600, 398], [600, 800]])
def test_plan_refuses_a_split_shorter_than_one_window_as_the_launch_would(tmp_path, sizes):
    """The launch refused a 1,000-byte corpus (its val split: 100 tokens < 129) after the
    plan had said nothing; the plan now counts the tokens from the files' sizes, the same
    count the launch's token files hold."""
    from dtrain_cli.corpus.prepare import window_problems

    folder = tmp_path / "notes"
    folder.mkdir()
    for i, size in enumerate(sizes):
        (folder / f"{i}.txt").write_bytes(b"x" * size)
    data = DataConfig(source="text", path=str(folder), cache_dir=str(tmp_path / "c"))
    launch = window_problems(data, prepare_corpus(data), 128, 256)
    plan = [e.removeprefix("error: ") for e in _plan_errors("data=text", f"data.path={folder}")]
    assert plan == launch
    assert bool(plan) == (sum(sizes) < 1400)  # val: a tenth of the bytes (and blank lines)


def test_val_path_validates_on_its_own_files_and_all_of_path_trains(tmp_path):
    """A dev.jsonl beside train.jsonl was concatenated into training, silently; the plan now
    says so, and data.val_path reads validation from its own file (text, hf, one token
    file)."""
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "a.txt").write_text("training text " * 20)
    (tmp_path / "dev.txt").write_text("held out")
    text = DataConfig(source="text", path=str(tmp_path / "train"), cache_dir=str(tmp_path))
    text.val_path = str(tmp_path / "dev.txt")
    paths = prepare_corpus(text)
    assert bytes(np.fromfile(paths["train"], np.uint16).astype(np.uint8)) == b"training text " * 20
    assert bytes(np.fromfile(paths["val"], np.uint16).astype(np.uint8)) == b"held out"
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    (tmp_path / "dev.jsonl").write_text(json.dumps({"text": "held out"}) + "\n")
    hf = DataConfig(source="hf", path=str(jsonl), val_path=str(tmp_path / "dev.jsonl"))
    paths = prepare_hf(hf, tmp_path / "c", 256)
    assert bytes(np.fromfile(paths["train"], np.uint16).astype(np.uint8)) == JOINED
    assert bytes(np.fromfile(paths["val"], np.uint16).astype(np.uint8)) == b"held out"
    (np.arange(500, dtype=np.uint16) % 256).tofile(tmp_path / "all.bin")
    (np.arange(300, dtype=np.uint16) % 7).tofile(tmp_path / "val.bin")
    tokens = DataConfig(source="tokens", path=str(tmp_path / "all.bin"), cache_dir=str(tmp_path))
    tokens.val_path = str(tmp_path / "val.bin")
    paths = prepare_corpus(tokens)
    assert len(np.fromfile(paths["train"], np.uint16)) == 500
    assert np.fromfile(paths["val"], np.uint16).tolist() == (np.arange(300) % 7).tolist()


def test_a_validation_file_inside_the_training_folder_is_warned(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS * 20))
    (folder / "dev.jsonl").write_text(json.dumps({"text": "held out"}) + "\n")
    args = ["plan", "recipe=gpt_tiny", "data=hf", f"data.path={folder}"]
    said = " ".join(CliRunner().invoke(app, args).output.split())
    assert f"data.path={folder} holds dev.jsonl: it is trained on" in said
    assert f"data.val_path={folder / 'dev.jsonl'} validates on it instead" in said
    (line,) = _plan_errors("data=hf", f"data.path={folder}", f"data.val_path={tmp_path}/no.jsonl")
    assert line == f"error: data.val_path={tmp_path}/no.jsonl: no such file or folder"
    (line,) = _plan_errors("data=synthetic", "data.val_path=x.txt")
    assert "data.val_path=x.txt: only read by data=text, data=tokens or data=hf" in line


def test_the_validation_file_warning_reads_names_and_folders_not_prefixes(tmp_path):
    """A code corpus's test_model.py was taken for a validation file; a val/ folder beside
    train/ was not; a data.val_path inside data.path was trained on too, silently (a
    reviewer's finds)."""

    def warned(*args: str) -> str:
        out = CliRunner().invoke(app, ["plan", "recipe=gpt_tiny", "data=text", *args,
                                       "model.block_size=1"]).output  # fmt: skip
        return " ".join(line for line in out.splitlines() if "trained on" in line)

    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "test_model.py").write_text("x")
    (code / "a.py").write_text("y")
    assert warned(f"data.path={code}") == ""
    split = tmp_path / "split"
    for part in ("train", "val"):
        (split / part).mkdir(parents=True)
        (split / part / "a.txt").write_text(part * 10)
    assert f"data.path={split} holds val/: it is trained on" in warned(f"data.path={split}")
    inside = warned(f"data.path={split}", f"data.val_path={split / 'val'}")
    assert f"data.val_path={split / 'val'} is inside data.path={split}" in inside
    assert warned(f"data.path={split / 'train'}", f"data.val_path={split / 'val'}") == ""
    (code / "test").mkdir()  # a source tree's tests: code, not a validation split
    (code / "test" / "unit.py").write_text("z")
    assert warned(f"data.path={code}") == ""


def test_a_saved_dataset_dicts_validation_split_is_not_warned(tmp_path):
    """Its validation/ folder validates (load_from_disk's split), it is not trained on."""
    import datasets

    train = datasets.Dataset.from_list(RECORDS)
    datasets.DatasetDict({"train": train, "validation": train}).save_to_disk(str(tmp_path / "d"))
    out = CliRunner().invoke(
        app, ["plan", "recipe=gpt_tiny", "data=hf", f"data.path={tmp_path / 'd'}"]
    )
    assert out.exit_code == 0 and "trained on" not in out.output


def test_a_short_validation_file_is_named_as_data_val_path(tmp_path):
    """It said 'data.path=...: its val split ...; a larger data.val_fraction', a setting a
    val_path run does not read."""
    (tmp_path / "train.txt").write_text("t" * 5000)
    (tmp_path / "val.txt").write_text("v" * 50)
    (line,) = _plan_errors("data=text", f"data.path={tmp_path / 'train.txt'}",
                           f"data.val_path={tmp_path / 'val.txt'}")  # fmt: skip
    assert line == (
        f"error: data.val_path={tmp_path / 'val.txt'}: its val split holds 50 tokens, fewer "
        "than one window of model.block_size+1=129; a longer validation file or a smaller "
        "model.block_size"
    )


def test_val_path_with_a_custom_dataset_is_refused(tmp_path):
    (line,) = _plan_errors("data=custom", "data._target_=tests.own_data.Pairs", "data.val_path=v")
    assert line.startswith("error: data.val_path=v: data=custom validates on data.val_target")


def test_a_home_relative_path_reads_at_launch_as_the_plan_checked(tmp_path, monkeypatch):
    """'~/corpus.txt' passed the plan (expanded) and failed the launch (not)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "corpus.txt").write_text("c" * 3000)
    (tmp_path / "dev.txt").write_text("d" * 300)
    data = DataConfig(source="text", path="~/corpus.txt", val_path="~/dev.txt")
    data.cache_dir = str(tmp_path / "c")
    paths = prepare_corpus(data)
    assert len(np.fromfile(paths["val"], np.uint16)) == 300


def test_a_text_field_that_is_not_text_is_refused_and_null_texts_are_left_out(tmp_path, capsys):
    """data.text_field=id trained on separators alone (every int became ""), exit 0; a null
    text was an empty record, a separator in the stream (a new user's finds)."""
    jsonl = tmp_path / "corpus.jsonl"
    rows = [
        {**r, "id": i, "chat": [{"role": "user", "content": "hi"}]} for i, r in enumerate(RECORDS)
    ]
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for field, kind in (("id", "int64"), ("chat", "lists (e.g. chat messages)")):
        data = DataConfig(source="hf", path=str(jsonl), text_field=field, val_fraction=0.1)
        with pytest.raises(ConfigError) as err:
            prepare_hf(data, tmp_path / "c", 256)
        assert err.value.problems == [
            f"data.text_field={field}: a column of {kind} in {jsonl}, not text: every record "
            "would train as an empty one; name a text column (text), or write the text into "
            "one first"
        ]
    nulls = tmp_path / "nulls.jsonl"
    with_nulls = [r if i % 4 else {"text": None} for i, r in enumerate(RECORDS * 2)]
    nulls.write_text("".join(json.dumps(r) + "\n" for r in RECORDS + with_nulls[len(RECORDS) :]))
    data = DataConfig(source="hf", path=str(nulls), val_fraction=0.1)
    joined = "\n\n".join(r["text"] for r in RECORDS + [r for r in with_nulls[40:] if r["text"]])
    assert bytes(_tokens(prepare_hf(data, tmp_path / "c", 256)).astype(np.uint8)) == joined.encode()
    assert f"warning: {nulls}: 10 records have no text (null): left out" in capsys.readouterr().err
    import datasets

    from dtrain_cli.corpus.hf import _texts

    tail = datasets.Dataset.from_list([{"text": "a"}] * 1024 + [{"text": None}] * 5)
    batches = list(_texts(data, tail, "json", "tail.jsonl", counted := {}))
    assert [len(b) for b in batches] == [1024] and counted == {"tail.jsonl": 5}  # no [] batch


@pytest.mark.parametrize(
    ("name", "content", "fmt", "why"),
    [
        (
            "bad.txt",
            b"hello \xff\xfe world\n" * 20,
            "text",
            "not UTF-8 text (data=text reads any bytes)",
        ),
        ("cut.jsonl", b'{"text": "fine"}\n{"text": "broken', "json", "JSON parse error"),
    ],
)
def test_a_file_datasets_cannot_read_is_one_line(name, content, fmt, why, tmp_path):
    """A 70-line traceback and exit 1 at launch, after the plan (which reads the first record
    only) found nothing wrong."""
    path = tmp_path / name
    path.write_bytes(content)
    data = DataConfig(source="hf", path=str(path), val_fraction=0.1)
    with pytest.raises(ConfigError) as err:
        prepare_hf(data, tmp_path / "c", 256)
    (line,) = err.value.problems
    assert line.startswith(f"data.path={path}: cannot be read as {fmt} records (") and why in line


def test_the_vocabulary_error_names_the_key_of_the_models_kind(hf_files):
    """model=hf's vocabulary is model.config.vocab_size: the error said to set
    model.vocab_size, which model=hf refuses as not a key (a new user's find)."""
    corpus, tok, size = hf_files
    data = [f"data.path={corpus}", f"data.tokenizer={tok}"]
    result = CliRunner().invoke(app, ["plan", "recipe=llama_tiny_hf", "data=hf", *data,
                                      "model.config.vocab_size=64"])  # fmt: skip
    said = " ".join(result.output.split())
    assert result.exit_code == 2
    assert f"error: model.config.vocab_size=64: below the tokenizer's {size} tokens" in said
    assert f"set model.config.vocab_size={size} or more" in said
    (line,) = _plan_errors("data=hf", *data, "model.vocab_size=64")
    assert f"set model.vocab_size={size} or more" in line  # the built-in GPT's own key


def test_a_validation_file_that_is_the_training_file_is_warned(tmp_path):
    """data.val_path=train.jsonl beside data.path=train.jsonl validated on what it trained
    on, without a word (a folder holding the file was warned)."""
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in RECORDS * 20))
    for same in (str(train), f"{tmp_path}/./train.jsonl"):
        args = ["plan", "recipe=gpt_tiny", "data=hf", f"data.path={train}", f"data.val_path={same}"]
        said = " ".join(CliRunner().invoke(app, args).output.split())
        assert f"warning: data.val_path={same} is data.path: the validation loss is on data" in said
    (tmp_path / "dev.jsonl").write_text(json.dumps({"text": "held out"}) + "\n")
    args = ["plan", "recipe=gpt_tiny", "data=hf", f"data.path={train}",
            f"data.val_path={tmp_path / 'dev.jsonl'}"]  # fmt: skip
    assert "is data.path" not in CliRunner().invoke(app, args).output


def test_a_run_dir_names_the_data_files_absolutely_so_a_resume_reads_them_anywhere(
    tmp_path, monkeypatch
):
    """config.yaml kept data.path=train.jsonl as typed: a resume from another folder failed
    ('no such file'), or trained on that folder's own train.jsonl with one generic warning
    (a new user's find). A path that names no file here stays as typed (its error says so)."""
    import yaml

    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.launch.rundir import materialize
    from dtrain_cli.plan.build import Resources, build_plan

    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS * 20))
    (tmp_path / "dev.jsonl").write_text(json.dumps({"text": "held out"}) + "\n")
    monkeypatch.chdir(tmp_path)
    cfg = compose_config("gpt_tiny", ["data=hf", "data.path=train.jsonl",
                                      "data.val_path=./dev.jsonl", "run.name=r"])  # fmt: skip
    run = materialize(cfg, build_plan(cfg, Resources(num_gpus=0, num_cpus=2)))
    data = yaml.safe_load((run / "config.yaml").read_text())["data"]
    assert (data["path"], data["val_path"]) == (
        str(tmp_path / "train.jsonl"),
        str(tmp_path / "dev.jsonl"),
    )
    assert cfg.data.path == "train.jsonl"  # the launcher's own config: unchanged


def test_an_hf_export_carries_the_runs_tokenizer_and_its_end_of_text_id(hf_files, tmp_path):
    """export --format hf wrote config.json and the weights only; the recipe's eos_token_id
    (gpt2_tiny_hf: 0) was <unk> in the user's tokenizer, and generate() stopped on it.
    Every training record ended with the tokenizer's own end-of-text token."""
    from transformers import AutoTokenizer

    from dtrain_cli.checkpoint.export import TOKENIZER_FILES, with_tokenizer
    from dtrain_cli.corpus.hf import load_tokenizer

    _, tok, _ = hf_files
    out = tmp_path / "exported"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model_type": "gpt2", "eos_token_id": 0}))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    files = with_tokenizer(tok, out)
    assert {f.name for f in files} == {p.name for p in tok.iterdir() if p.name in TOKENIZER_FILES}
    assert (out / "tokenizer.json").is_file()
    eos = load_tokenizer(str(tok)).eos_id
    assert eos not in (None, 0)
    for name in ("config.json", "generation_config.json"):
        assert json.loads((out / name).read_text())["eos_token_id"] == eos
    loaded = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert (
        loaded("model trains", add_special_tokens=False)["input_ids"]
        == load_tokenizer(str(tok)).encode_batch(["model trains"])[0]
    )


def test_an_empty_file_unset_path_and_records_read_as_text_are_said_plainly(tmp_path):
    """An empty .jsonl was 'not a field of ... (fields: none)'; ~data.path gave 'data.path=None:
    files of several formats' (the current folder read) before 'data.path is required';
    data=text of a .jsonl trained on its JSON's bytes without a word (a new user's finds)."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert _plan_errors("data=hf", f"data.path={empty}") == [
        f"error: data.path={empty}: empty (no record in it)"
    ]
    assert _plan_errors("data=hf", "~data.path") == [
        "error: data.path is required for data.source=hf"
    ]
    records = tmp_path / "r.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in RECORDS * 20))
    args = ["plan", "recipe=gpt_tiny", "data=text", f"data.path={records}"]
    said = " ".join(CliRunner().invoke(app, args).output.split())
    assert f"warning: data.path={records}: .jsonl records, read by data=text as raw bytes" in said
    (tmp_path / "code").mkdir()  # a code corpus with a JSON file among its sources: no word
    (tmp_path / "code" / "a.py").write_text("print('hello')\n" * 400)
    (tmp_path / "code" / "b.json").write_text("{}")
    args = ["plan", "recipe=gpt_tiny", "data=text", f"data.path={tmp_path / 'code'}"]
    assert "raw bytes" not in CliRunner().invoke(app, args).output


def test_a_run_that_passes_over_a_small_corpus_many_times_is_warned(tmp_path):
    """A 1.4 KB corpus trained 30 steps x 16 sequences, about 50 passes, said nothing (a new
    user's find); a run of a few passes is not warned."""
    from dtrain_cli.corpus.prepare import epochs_warning

    (np.arange(1001, dtype=np.uint16) % 256).tofile(tmp_path / "train.bin")
    data = DataConfig(source="tokens", path=str(tmp_path / "all.bin"))
    paths = {"train": tmp_path / "train.bin"}
    assert epochs_warning(data, paths, 100, 99) is None  # 9.9 passes over 10 windows
    assert epochs_warning(data, paths, 100, 480) == (
        f"480 training samples (train.steps x the global batch) are 48 passes over "
        f"data.path={tmp_path / 'all.bin'}'s 10 windows of 100 tokens: a small corpus the model "
        "will learn by heart; more data, or fewer train.steps"
    )
    assert epochs_warning(data, paths, None, 480) is None  # a model without token windows


def test_export_model_puts_a_loadable_tokenizer_beside_the_model(hf_files, tmp_path):
    """The export's own JSON files get 'source' and 'step' keys; the tokenizer's got them too
    (tokenizer.json then no longer loads: a review's find)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dtrain_cli.checkpoint.export import export_model
    from dtrain_cli.config.compose import compose_config, config_to_yaml
    from dtrain_cli.models import model_spec

    corpus, tok, size = hf_files
    cfg = compose_config("gpt2_tiny_hf", ["data=hf", f"data.path={corpus}",
                         f"data.tokenizer={tok}", f"model.config.vocab_size={size}"])  # fmt: skip
    ckpt = tmp_path / "step_000002"
    model = model_spec(cfg).build("cpu")
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(ckpt), no_dist=True)
    (ckpt / "config.yaml").write_text(config_to_yaml(cfg))
    (ckpt / "meta.json").write_text(json.dumps({"step": 2, "complete": True}))
    out = tmp_path / "exported"
    export_model(ckpt, out, "hf")
    assert "step" not in json.loads((out / "tokenizer.json").read_text())
    loaded = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert loaded.eos_token_id == json.loads((out / "config.json").read_text())["eos_token_id"]
    back = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    x = torch.tensor([loaded("model trains", add_special_tokens=False)["input_ids"]])
    assert back(x).logits.shape[-1] == size
