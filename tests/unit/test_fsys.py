"""The file-system layer's helpers: :func:`~tfrecordd.fsys.sync_folders`."""

from __future__ import annotations

from pathlib import Path

from tests.support import DirSyncs
from tfrecordd.fsys import sync_folders


def test_each_folder_from_the_root_down_to_the_files_own_is_fsynced(tmp_path: Path) -> None:
    """Each fsync makes the next level's entry durable, the last one the file's: a folder a
    killed process made, or a file it renamed in, before the fsync that would have followed."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    fs = DirSyncs()
    sync_folders(fs, str(tmp_path), str(tmp_path / "a" / "b" / "state.json"))
    assert fs.folders == [str(tmp_path), str(tmp_path / "a"), str(tmp_path / "a" / "b")]


def test_the_levels_that_do_not_exist_are_left_alone(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    fs = DirSyncs()
    sync_folders(fs, str(tmp_path), str(tmp_path / "a" / "b" / "state.json"))
    assert fs.folders == [str(tmp_path), str(tmp_path / "a")]


def test_a_file_outside_the_root_gets_its_own_folder_fsynced_only(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "elsewhere").mkdir()
    fs = DirSyncs()
    sync_folders(fs, str(tmp_path / "root"), str(tmp_path / "elsewhere" / "state.json"))
    assert fs.folders == [str(tmp_path / "elsewhere")]
