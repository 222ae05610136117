"""`datakit bench-decoders`: PyAV vs Decord vs TorchCodec, measured the way training reads video.

Modules, in the order a run uses them:
- videos.py: the generated test videos (cached) or the user's files / dataset samples;
- patterns.py: access patterns (sequential, clip, strided, single, multiview) as reads;
- matrix.py: which measurements: the main matrix, then one-setting-at-a-time sweeps;
- measure.py: a job, and the timing loop inside the measured process (with frame checks);
- worker.py / runner.py: one fresh process per measurement, crashes become error records;
- crosscheck.py: PSNR between backends on the same frames;
- recommend.py: per-codec, per-pattern ranking and the file `convert --decoder auto` reads;
- report.py / plot.py: terminal tables, Markdown, PNG; command.py: the CLI.

Kept light on purpose (no imports here): the worker process imports only what it measures.
"""
