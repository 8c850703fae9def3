"""The rules several floors share, each said once in mars_core: path vs hub id, trained block
size, context length, comma-separated lists."""
import argparse
import json

import pytest

from conftest import make_model
from mars_core.lists import ListError, list_arg, parse_list
from mars_core.loading import is_local_path, trained_block_size
from mars_core.prompts import check_context


@pytest.mark.parametrize("name,local", [
    ("owner/model", False), ("Xalphinions/MARS-Qwen2.5-0.5B-blk4", False),
    ("./owner/model", True), ("/abs/path", True), ("~/x", True), ("a/b/c", True), ("plain", True),
    ("a\\b", True),
])
def test_is_local_path(name, local):
    assert is_local_path(name) is local


def test_is_local_path_sees_an_existing_owner_name_folder(tmp_path, monkeypatch):
    (tmp_path / "owner" / "model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert is_local_path("owner/model")


def test_the_playground_never_reads_a_typed_name_as_a_server_folder(tmp_path, monkeypatch):
    """A hub-shaped name is a hub id even where a folder of that name exists in the working
    directory; everything else that is not a hub id is a hidden server path."""
    from playground.models import display_name, is_local, operator_source

    (tmp_path / "owner" / "model").mkdir(parents=True)
    (tmp_path / "owner" / "model" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    names = ["owner/model", "other/model", "./owner/model", "/abs/path", "~/x", "a/b/c", "plain", "a b/c"]
    assert [is_local(n) for n in names] == [False, False, True, True, True, True, True, True]
    assert display_name("owner/model") == "owner/model"
    assert operator_source("owner/model") == str(tmp_path / "owner" / "model")  # an operator's folder
    assert is_local(operator_source("owner/model"))
    assert operator_source("other/model") == "other/model"
    assert operator_source("smollm2-135m-instruct") == "smollm2-135m-instruct"


def test_a_hub_shaped_name_never_loads_a_working_directory_folder(tmp_path, monkeypatch):
    """The picker's path: the same answer for a name that exists as a folder here and one that does not."""
    import huggingface_hub

    from playground.models import Catalog, ModelStore, hub_loader

    (tmp_path / "owner" / "model").mkdir(parents=True)
    (tmp_path / "owner" / "model" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    loaded = []

    def offline(repo_id, **kw):
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    store = ModelStore(loader=hub_loader(lambda src, **kw: loaded.append(src)))
    messages = []
    for name in ("owner/model", "owner/missing"):
        source = Catalog([]).resolve(name)
        with pytest.raises(ValueError) as e:
            store.get(source)
        messages.append(str(e.value).replace(name, "NAME"))
    assert loaded == [] and messages[0] == messages[1]
    assert "hub" in messages[0]


def _run_folder(tmp_path, name, stage, block_size):
    d = tmp_path / name
    d.mkdir()
    (d / "training_config.json").write_text(json.dumps({"args": {"stage": stage, "block_size": block_size}}))
    return str(d)


def test_trained_block_size(tmp_path, tokenizer):
    assert trained_block_size(_run_folder(tmp_path, "m", "mars", 8)) == 8
    assert trained_block_size(_run_folder(tmp_path, "a", "ar", 4)) is None  # an AR run records the default B
    assert trained_block_size(_run_folder(tmp_path, "x-blk4", "ar", 4)) is None  # the record wins over the name
    assert trained_block_size("Xalphinions/MARS-Qwen2.5-0.5B-blk4") == 4
    assert trained_block_size("Xalphinions/MARS-Qwen2.5-0.5B-AR-SFT") is None
    assert trained_block_size(str(tmp_path / "missing")) is None
    model = make_model("qwen2", len(tokenizer))
    model.config._name_or_path = _run_folder(tmp_path, "m2", "mars", 2)
    assert trained_block_size(model) == 2


def test_bundled_mars_model_block_size():
    from playground.models import BUNDLED_AR, BUNDLED_MARS

    assert trained_block_size(BUNDLED_MARS) == 4 and trained_block_size(BUNDLED_AR) is None


def test_check_context(tokenizer):
    model = make_model("qwen2", len(tokenizer))  # 512 positions
    check_context(model, [[1] * 500], max_new_tokens=8, block_size=4)  # 512: fits exactly
    with pytest.raises(ValueError, match=r"prompt 1 has 501 tokens.*needs 513 positions but the model has 512"):
        check_context(model, [[1] * 10, [1] * 501], max_new_tokens=8, block_size=4)
    with pytest.raises(ValueError, match="prompt 0 encodes to no tokens"):
        check_context(model, [[]], max_new_tokens=8, block_size=1)


def test_parse_list():
    assert parse_list("0.95, 0.8,") == (0.95, 0.8)
    assert parse_list("1,4", int, minimum=1) == (1, 4)
    assert parse_list("ar, mars-cursor", str) == ("ar", "mars-cursor")
    assert parse_list(" ", float, allow_empty=True) == ()
    for text, kind, kw, match in (("a,b", float, {}, "taus: expected comma-separated numbers"),
                                  ("1.5", int, {}, "integers"), ("0,2", int, {"minimum": 1}, ">= 1"),
                                  ("", float, {}, "at least one")):
        with pytest.raises(ValueError, match=match):
            parse_list(text, kind, name="taus", **kw)


def test_list_arg_message_reaches_argparse(capsys):
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=list_arg(int, minimum=1))
    assert p.parse_args(["--sizes", "1,8"]).sizes == (1, 8)
    with pytest.raises(SystemExit):
        p.parse_args(["--sizes", "0"])
    assert "expected comma-separated integers >= 1, got '0'" in capsys.readouterr().err
    assert issubclass(ListError, ValueError)


def test_exact_check_reads_its_lists_with_the_shared_parser(capsys):
    from benchmarks.exact_check import RUNS, parse_args

    args = parse_args(["--batch-sizes", "1, 8,", "--runs", "spec,lossless"])
    assert args.batch_sizes == (1, 8) and args.runs == ("spec", "lossless")
    assert parse_args([]).runs == tuple(RUNS) and parse_args([]).batch_sizes == (1, 8, 32)
    for bad, message in ((["--batch-sizes", "0"], "integers >= 1"), (["--runs", "spec,ring"], "unknown runs ['ring']")):
        with pytest.raises(SystemExit):
            parse_args(bad)
        assert message in capsys.readouterr().err
