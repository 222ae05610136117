#!/usr/bin/env bash
# quiet-machine table for issue 27 item 6: default vs one/two PyAV workers, 2 interleaved rounds
DK=/work/main/.venv/bin/datakit
out=/tmp/cvt_table.csv; echo "codec,episodes,size,mode,round,wall_s,load" > $out
for codec in h264 hevc av1; do for ep in 8 16; do for size in native 224; do
  src=/tmp/c27/$codec-$ep
  rs=""; [ $size = 224 ] && rs="--resize 224x224"
  for r in 1 2; do for mode in default w1 w2; do
    case $mode in default) a="";; w1) a="--workers 1 --decoder pyav";; w2) a="--workers 2 --decoder pyav";; esac
    rm -rf /tmp/cvt/o; s=$(date +%s.%N)
    $DK convert $src /tmp/cvt/o $rs $a > /tmp/cvt/last.log 2>&1 || echo "FAIL $codec $ep $size $mode" >> $out
    e=$(date +%s.%N)
    echo "$codec,$ep,$size,$mode,$r,$(echo "$e - $s" | bc),$(cut -d' ' -f1 /proc/loadavg)" >> $out
  done; done
done; done; done
echo done >> $out
