"""`RunDirectory`'s files are written whole (`whole_file`): an error or a kill while one is
written leaves its last version. (tests/test_run_processes.py reads them while a run writes
them, and kills runs at random moments.)"""

import pytest

from kadapt.run.run_directory import whole_file


def test_whole_file_leaves_the_last_version_when_writing_fails(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('{"status": "training"}')
    with pytest.raises(OSError), whole_file(path) as temporary:
        temporary.write_text('{"sta')
        raise OSError("No space left on device")
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"] and path.read_text() == '{"status": "training"}'
