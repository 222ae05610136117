"""`datakit doctor SRC`: audit a source dataset without converting it.

    datakit doctor data/my_lerobot_ds                 # table of findings; exit 1 on errors (0: warnings only)
    datakit doctor data/my_lerobot_ds --strict        # exit 1 on warnings too (CI gates)
    datakit doctor data/droid --workers 8 --json report.json
    datakit doctor data/ds --json - --ignore blank_camera   # JSON on stdout, table on stderr
    datakit doctor --list-checks                      # every kind of finding: severity, meaning

Every frame of every camera is decoded (FFmpeg via PyAV, packet by packet, so damage is pinned to
a frame) and every table is read, one episode per task on a process pool (`--workers`, default
all cores) with a progress bar. A defect never stops the audit: each becomes a finding naming the
file, the episode and the frame. Input that is not a dataset folder at all exits 2; a dataset whose
metadata cannot be scanned gives one `metadata` finding (exit 1).

Kinds of finding (severity "error": convert rejects it; "warning": convert accepts it but it
silently hurts training), registered with their severity and meaning in
`datakit.sources.checks.FINDINGS` (what `--list-checks` prints). Metadata and table invariants come from `datakit.sources.checks`, the
same functions convert applies:
- metadata: `metadata` (scan failed), `empty_dataset`, `duplicate_episode`, `bad_episode_index`,
  `bad_length`, `bad_video_range`, `overlapping_video_range`, `video_range_off_grid` (a v3.0
  from_timestamp between frames), `shared_video` (two episodes claim one whole video file),
  `episode_count`, `episode_gap`, `unsafe_camera_name` (also: too long for a tar member name)
- files: `missing_file` (table or video), `table` (table unreadable or inconsistent)
- table values: `length_mismatch`, `frame_index`, `timestamp` (backwards or not finite),
  `timestamp_gap` (off the fps grid), `task_index`, `vector_width`, `nonfinite` (NaN/inf/float32
  overflow in state/action)
- video: `video_unreadable`, `video_fps`, `video_size`, `video_decode_error`, `video_corrupt_frame`,
  `video_frame_count`, `video_timestamps`; cameras stored as images in the table: `image_unreadable`,
  `image_size`; any camera: `blank_camera`, `frozen_camera`
- dataset-wide: `constant_column` (a state/action column with one value everywhere), `unused_task`,
  `duplicate_episode_content` (the same state/action values as an earlier episode)
- `audit_failed`: an unforeseen error while auditing one episode (the others are still audited)

JSON (`--json FILE`, or `-` for stdout; strict JSON, schema "datakit.doctor/1"):
    schema, source, format, version, episodes, frames_decoded, seconds,
    clean (bool), errors, warnings (counts), counts ({kind: n}),
    findings: [{kind, severity, path, episode (int|null), frame (int|null), message}]
`episode` is the dataset's episode_index; `frame` counts from 0 at the episode's first frame;
null where a finding is about a whole file, episode or dataset.
"""
from datakit.commands.doctor.audit import DoctorReport, audit_dataset
from datakit.commands.doctor.command import add_parser, main, run

__all__ = ["DoctorReport", "add_parser", "audit_dataset", "main", "run"]
