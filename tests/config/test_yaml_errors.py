"""A broken YAML config file (``rlforge train --config FILE``) gives one message naming the file, the
line and column, and the cause (for a duplicated key: the key), not the parser's first line alone."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import user_error

from rlforge.cli import main
from rlforge.config import load_config
from rlforge.errors import ConfigError

DUPLICATE = "trainer:\n  total_training_steps: 2\n  logger: [file]\n  total_training_steps: 3\n"
UNCLOSED = "data:\n  train_batch_size: 4\n  train_files: [a.parquet, b.parquet\n  val_files: null\n"
TAB = "trainer:\n\ttotal_training_steps: 2\n"


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (DUPLICATE, ["line 4, column 3", "duplicate key 'total_training_steps'", "mapping starts at line 2"]),
        (UNCLOSED, ["line 4, column 12", "did not find expected ',' or ']'", "flow sequence started at line 3"]),
        (TAB, ["line 2, column 1", "found character that cannot start any token"]),
    ],
    ids=["duplicate-key", "unclosed-list", "tab-indent"],
)
def test_yaml_error_names_file_line_column_and_cause(tmp_path, text, fragments):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config([], config_file=path)
    msg = str(info.value)
    assert "\n" not in msg
    for fragment in [f"config file '{path}'", *fragments]:
        assert fragment in msg, (fragment, msg)


def test_cli_reports_a_duplicated_key_as_one_error_line(tmp_path, capfd):
    path = _write(tmp_path, DUPLICATE)
    capfd.readouterr()
    status = main(["train", "--config", path, "trainer.device=cpu"])
    _, err = capfd.readouterr()
    user_error(subprocess.CompletedProcess([], status, "", err), path, "line 4, column 3",
               "duplicate key 'total_training_steps'")
