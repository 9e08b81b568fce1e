"""``toolgrpo report`` (issue #20 item 2) without a browser: what the page holds and refuses."""

from __future__ import annotations

import json
import re

import pytest

from tests.report.runs import HOSTILE, make_run
from toolgrpo.cli import main
from toolgrpo.report.data import ReportError, load_run
from toolgrpo.report.html import write_report
from toolgrpo.trainer.summary import best_held_out


def embedded(page: str) -> dict:
    m = re.search(r"<script type='application/json' id='rollouts'>\n(.*?)\n</script>", page, re.S)
    assert m is not None
    return json.loads(m.group(1))


def test_report_is_self_contained_and_holds_every_dumped_episode(tmp_path):
    run = make_run(tmp_path, steps=3, group=4, tasks=2)
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    # Nothing to fetch at view time: no external script, style, image or font.
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:)?//", page)
    assert page.count("<svg") >= 4  # reward, held-out, tools, router, timing panels
    rows = embedded(page)
    assert sorted(rows) == ["1", "2", "3"] and all(len(v) == 10 for v in rows.values())
    assert "1 unreadable lines skipped" in page  # the torn line is counted, not fatal
    # Model output and config text never become markup.
    assert HOSTILE not in page
    assert "</script><script>window.pwned" not in page.split("<script type='application/json'")[1]


def test_best_held_out_picks_the_highest_accuracy(tmp_path):
    data = load_run(make_run(tmp_path))
    assert best_held_out(data.metrics) == ("val/all/accuracy", pytest.approx(0.3), 3)


def test_empty_or_missing_run_is_one_line_error(tmp_path, capsys):
    with pytest.raises(ReportError, match="no config.yaml"):
        write_report(tmp_path)
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_report_without_dumps_says_how_to_get_them(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    page = write_report(run).read_text()
    assert "trainer.rollout_data_dir" in page and embedded(page) == {}


def test_groups_with_signal_get_a_panel_when_logged(tmp_path):
    from toolgrpo.report.plots import metric_svgs

    recs = [{"step": 1, "reward/mean": 0.5}]
    assert "Groups with signal" not in [t for t, _, _ in metric_svgs(recs)]
    recs = [{"step": s, "reward/groups_all_equal_frac": 0.5, "filter_groups/informative_frac": 0.4}
            for s in (1, 2)]  # fmt: skip
    panels = {t: keys for t, keys, _ in metric_svgs(recs)}
    assert panels["Groups with signal"] == [
        "reward/groups_all_equal_frac",
        "filter_groups/informative_frac",
    ]


def test_a_linked_report_html_is_refused_not_written_through(tmp_path, capsys):
    """Was: ``RUN/report.html`` a link replaced the link's target with the page and printed
    "wrote RUN/report.html"."""
    run = make_run(tmp_path, steps=1)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (run / "report.html").symlink_to(victim)
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert "report.html is a symbolic link" in err and "Traceback" not in err
    assert victim.read_text() == "keep me"
