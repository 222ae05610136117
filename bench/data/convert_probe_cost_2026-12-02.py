"""What `--decoder auto` paid per video before 35c49ac (a separate probe, the decoder's own probe, and a
frame-0 decode before the read): CPU time in-process over the 32 videos of each 16-episode source of
convert_defaults_2026-12-02b.sh (/tmp/c27/<codec>-16), 2 rounds, the second printed.
Run 2026-12-02 ~15:40 UTC on the 2-core AMD EPYC VM, main at 35c49ac, `.venv/bin/python` this file:
    h264 32 probe 3.51 ms, open 3.59 ms, open+frame0 11.00 ms (frame0 7.40)
    hevc 32 probe 0.26 ms, open 0.30 ms, open+frame0 6.37 ms (frame0 6.07)
    av1 32 probe 0.26 ms, open 0.30 ms, open+frame0 3.92 ms (frame0 3.62)
(at 35c49ac "open" is one PyAV open whose container is also the probe)."""
import glob
import time

from datakit.decoders import open_decoder, probe_video

for codec in ("h264", "hevc", "av1"):
    vids = sorted(glob.glob(f"/tmp/c27/{codec}-16/videos/**/*.mp4", recursive=True))
    for _ in range(2):
        t = time.process_time()
        for v in vids:
            probe_video(v)
        probe = (time.process_time() - t) / len(vids)
        t = time.process_time()
        for v in vids:
            d = open_decoder(v, "pyav")
            d.get_frames([0])
            d.close()
        f0 = (time.process_time() - t) / len(vids)
        t = time.process_time()
        for v in vids:
            open_decoder(v, "pyav").close()
        op = (time.process_time() - t) / len(vids)
    print(codec, len(vids), f"probe {probe*1e3:.2f} ms, open {op*1e3:.2f} ms, open+frame0 {f0*1e3:.2f} ms "
          f"(frame0 {1e3*(f0-op):.2f})")
