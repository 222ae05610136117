#!/usr/bin/env bash
# Quiet-machine table for issue 27 item 6 after `--decoder auto` stopped probing each video twice and
# decoding frame 0 before the read: default vs one / two PyAV workers, 3 interleaved rounds.
# Sources (made first if absent): 480x640 LeRobot v2.1, two real cameras, 50 frames an episode, 15 fps.
set -u
PY=${PY:-/work/main/.venv/bin/python}; DK=$(dirname "$PY")/datakit
out=${1:-/tmp/cvt_table_b.csv}; echo "codec,episodes,size,mode,round,wall_s,load" > "$out"
"$PY" - <<'PYEOF'
from pathlib import Path
from datakit.synth import make_lerobot_dataset
cams = ("observation.images.cam0", "observation.images.cam1")
for codec in ("h264", "hevc", "av1"):
    for ep in (8, 16):
        src = Path(f"/tmp/c27/{codec}-{ep}")
        if not (src / "meta" / "info.json").exists():
            make_lerobot_dataset(src, version="v2.1", codec=codec, height=480, width=640, fps=15, cameras=cams,
                                 blank_cameras=(), episode_lengths=[50] * ep, detail=1.0)
PYEOF
mkdir -p /tmp/cvt
for codec in h264 hevc av1; do for ep in 8 16; do for size in native 224; do
  src=/tmp/c27/$codec-$ep
  rs=""; [ $size = 224 ] && rs="--resize 224x224"
  for r in 1 2 3; do for mode in default w1 w2; do
    case $mode in default) a="";; w1) a="--workers 1 --decoder pyav";; w2) a="--workers 2 --decoder pyav";; esac
    rm -rf /tmp/cvt/o; s=$(date +%s.%N)
    $DK convert $src /tmp/cvt/o $rs $a > /tmp/cvt/last.log 2>&1 || echo "FAIL $codec $ep $size $mode" >> "$out"
    e=$(date +%s.%N)
    echo "$codec,$ep,$size,$mode,$r,$(echo "$e - $s" | bc),$(cut -d' ' -f1 /proc/loadavg)" >> "$out"
  done; done
done; done; done
echo done >> "$out"
