"""The library API (profattr/api.py): what `import profattr` gives a notebook equals what the CLI prints."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import profattr
from profattr.cli import cli
from independent import sql

GLM = "examples/h200/glm5/glm-triton-bs1-r1.sqlite"
GLM_B = "examples/h200/glm5/glm-cutlass-bs1-r1.sqlite"


def _cli_json(*args):
    result = CliRunner().invoke(cli, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def glm_budget():
    return profattr.open(GLM).budget()


def test_exports():
    assert set(profattr.__all__) >= {"open", "Capture", "Budget", "diff", "gap", "check", "report", "classify",
                                     "Ledger", "ProfattrError"}
    for name in profattr.__all__:
        assert hasattr(profattr, name), name


def test_open_reads_format_and_run_record():
    cap = profattr.open(GLM)
    assert cap.format == "nsys"
    with open(GLM.replace(".sqlite", ".run.json")) as fh:
        run = json.load(fh)
    assert cap.run.raw == run  # the run.json beside it, as a RunRecord
    assert (cap.run.schema, cap.run.model, cap.run.batch) == (run["schema"], run["model"], run["requests"]["batch"])
    assert profattr.open(cap) is cap


def test_budget_to_dict_equals_cli_json(glm_budget):
    assert glm_budget.to_dict() == _cli_json("budget", GLM)
    assert json.loads(glm_budget.to_json()) == glm_budget.to_dict()
    assert glm_budget.schema == "profattr.budget/1"
    assert glm_budget.devices is glm_budget.to_dict()["devices"]


def test_budget_tables_sum_to_the_json(glm_budget):
    tables = glm_budget.to_pandas()
    data = glm_budget.to_dict()
    assert data["steps"]["count"] == len(tables["steps"])
    for dev in data["devices"]:
        d = dev["device"]
        cats = tables["categories"][tables["categories"]["device"] == d]
        # exclusive time of the categories and idle add up to the mean step
        assert cats["exclusive_ms_per_step"].sum() + dev["idle_ms_per_step"] == pytest.approx(dev["mean_step_ms"])
        steps = tables["steps"][tables["steps"]["device"] == d]
        assert len(steps) == dev["steps"]
        assert steps["span_ms"].mean() == pytest.approx(dev["mean_step_ms"])
        assert steps["idle_ms"].mean() == pytest.approx(dev["idle_ms_per_step"])
        assert steps["kernels"].mean() == pytest.approx(dev["kernels_per_step"])
        per_cat = tables["step_categories"][tables["step_categories"]["device"] == d].groupby("category")["ns"].sum()
        for row in dev["categories"]:
            assert per_cat[row["category"]] / 1e6 / dev["steps"] == pytest.approx(row["ms_per_step"])
        kernels = tables["kernels"][tables["kernels"]["device"] == d]
        assert kernels["ms_per_step"].sum() <= cats["ms_per_step"].sum() * (1 + 1e-9)


def test_budget_kernels_are_the_exports_kernels(glm_budget):
    # independent: the kernel names in the SQLite export
    names = {r[0] for r in sql(GLM, "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                    "JOIN StringIds s ON s.id = k.shortName")}
    listed = {n for n in glm_budget.to_pandas()["kernels"]["name"] if not n.startswith("[CUDA mem")}
    assert listed and listed <= names


def test_classify_equals_cli():
    names = ["_w8a8_block_fp8_matmul", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "no_such_kernel_xyz"]
    assert profattr.classify(names) == _cli_json("classify", *names)


def test_diff_equals_cli():
    a, b = profattr.open(GLM), profattr.open(GLM_B)
    ours = profattr.diff(a, b, samples=50).to_dict()
    assert ours == _cli_json("diff", GLM, GLM_B, "--samples", "50")
    assert ours["schema"].startswith("profattr.diff/")


def test_check_equals_cli():
    ours = profattr.check(GLM).to_dict()
    result = CliRunner().invoke(cli, ["check", GLM, "--format", "json"])
    assert ours == json.loads(result.stdout)
    assert ours["status"] in ("pass", "warn", "fail")


def test_bad_input_is_a_plain_exception():
    with pytest.raises(profattr.ProfattrError) as info:
        profattr.open("examples/h200/no-such-capture.sqlite")
    assert "no such file" in str(info.value)
    assert not isinstance(info.value, __import__("click").ClickException)  # a plain Exception, no Click needed
    assert info.value.exit_code == 2


def test_ledger_add_and_list(tmp_path):
    ledger = profattr.Ledger(tmp_path / "ledger.db")
    added = ledger.add([GLM], labels=["triton"])
    assert [a["status"] for a in added] == ["added"]
    rows = ledger.entries()
    assert [r["label"] for r in rows] == ["triton"]
    shown = ledger.show("triton")
    assert shown["budget"]["devices"][0]["mean_step_ms"] == pytest.approx(
        profattr.open(GLM).budget().devices[0]["mean_step_ms"])


def test_input_warnings_are_python_warnings_in_the_library(tmp_path):
    from badinput import KERNEL, copy_export
    from badinput import sql as run_sql

    cap = copy_export(tmp_path)
    run_sql(cap, f"UPDATE {KERNEL} SET streamId = -3 WHERE rowid = (SELECT min(rowid) FROM {KERNEL})")
    with pytest.warns(profattr.errors.ProfattrWarning, match="skipped 1 damaged row"):
        data = profattr.open(cap).budget().to_dict()
    assert data["capture"]["skipped_rows"][KERNEL]["rows"] == 1
    # the CLI still says it as one `warning:` line on stderr
    result = CliRunner().invoke(cli, ["budget", str(cap), "--format", "json", "--no-cache"])
    assert result.exit_code == 0 and result.stderr.count("warning: ") == 1 and "damaged row" in result.stderr


def test_classify_with_user_rules_runs_on_re2(tmp_path):
    import re

    rules = tmp_path / "nested.toml"
    rules.write_text('[[rule]]\nid = "mine.nested"\ncategory = "norm"\npattern = "(a+)+$"\n')
    names = ["a" * 4096, "a" * 4095 + "!"]
    expected = ["norm" if re.search("a+$", n) else "unclassified" for n in names]  # the same language, linear
    assert [row["category"] for row in profattr.classify(names, rules=[rules])] == expected
    (tmp_path / "back.toml").write_text('[[rule]]\nid = "mine.back"\ncategory = "norm"\npattern = "(a)\\\\1"\n')
    with pytest.raises(profattr.ProfattrError, match=r"back\.toml:4.*RE2"):
        profattr.classify(["aa"], rules=[tmp_path / "back.toml"])


def test_commands_ending_out_of_order_leave_library_warnings_as_python_warnings():
    """Two CLI commands on two threads of one process (the second starting before the first ends, the first ending
    first): warnings go to stderr while either runs, and to Python's warnings once both have ended. Saving and
    restoring the setting per command left it on stderr for every later library call."""
    from profattr import errors

    first, second = errors.command_warnings(), errors.command_warnings()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert errors._to_stderr  # the second still runs
    second.__exit__(None, None, None)
    assert not errors._to_stderr
    errors.reset_warnings()
    with pytest.warns(profattr.errors.ProfattrWarning, match="said as a warning"):
        errors.warn("said as a warning")
