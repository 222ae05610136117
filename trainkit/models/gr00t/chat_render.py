"""Rendering a checkpoint's chat template, bounded: once per prompt shape (the number of views),
in a child process with a wall-clock limit, a memory limit and an output-size limit.

Why a child: a template is code from the checkpoint folder. jinja2's sandbox stops escapes (no
attribute access to internals, `range` capped at 100,000), but not cost: two nested
`range(100000)` loops are 10^10 iterations, a `namespace` string doubled in a loop is 2^n bytes,
a deep recursion or `"x" * 10**12` is a RecursionError or a MemoryError. A thread cannot be
stopped and an alarm only works on the main thread; a process can be killed. The child starts
once per launch (about 0.1 s: python and jinja2) and renders every shape the run needs.

What is rendered: one user turn of V image parts and one text part holding `TASK_SENTINEL`;
the caller splits the result at the sentinel and puts each sample's task there, so the template
runs once per V, not once per sample (the sample rate never waits on jinja, and a costly template
costs once). `render_shapes(..., trusted=True)` renders in this process (the builtin template).

Run as a script (`python chat_render.py`, JSON on stdin, JSON on stdout) it imports nothing of
trainkit, so the child needs only jinja2.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

TASK_SENTINEL = "\u2063trainkit-task\u2063"  # where the task goes; invisible separator U+2063 either side
RENDER_SECONDS = 10.0       # wall-clock limit of the child (Qwen's template renders in under a millisecond)
RENDER_CHARS = 1 << 20      # output limit per shape (a prompt is a few hundred characters)
RENDER_MEMORY = 1 << 30     # address-space limit of the child (bytes)


class RenderError(Exception):
    """The template does not compile or render; `str(err)` is the reason, one line."""


def compile_template(source: str):
    """The chat template compiled in transformers' sandbox settings (trim_blocks, lstrip_blocks,
    loop controls, `tojson`, `raise_exception`)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise RenderError(f"fails: raise_exception: {str(message)[:160]}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise RenderError(f"does not compile: {e.message} (line {e.lineno})") from None
    except (jinja2.TemplateError, RecursionError, MemoryError) as e:
        raise RenderError(f"does not compile: {type(e).__name__}: {_short(e)}") from None


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:160]


def _render_one(template, views: int, specials: dict[str, str], max_chars: int) -> str:
    conversation = [{"role": "user", "content": [*({"type": "image"} for _ in range(views)),
                                                 {"type": "text", "text": TASK_SENTINEL}]}]
    out: list[str] = []
    size = 0
    for chunk in template.generate(messages=conversation, add_generation_prompt=False, tools=None, documents=None,
                                   **specials):
        size += len(chunk)
        if size > max_chars:
            raise RenderError(f"renders more than {max_chars} characters for {views} views")
        out.append(chunk)
    return "".join(out)


def render_here(source: str, views: list[int], specials: dict[str, str], max_chars: int) -> list[str]:
    """Each shape's rendering, in this process; RenderError (one line) for any failure."""
    template = compile_template(source)
    try:
        return [_render_one(template, v, specials, max_chars) for v in views]
    except RenderError:
        raise
    except (Exception, MemoryError, RecursionError) as e:  # noqa: BLE001 - the template's own failure, any kind
        raise RenderError(f"fails: {type(e).__name__}: {_short(e) or 'out of memory'}") from None


def render_shapes(source: str, views: list[int], specials: dict[str, str], *, trusted: bool = False,
                  seconds: float | None = None, max_chars: int = RENDER_CHARS) -> list[str]:
    """The template rendered for each number of views (module docstring); untrusted: in a child
    killed after `seconds` (RENDER_SECONDS). RenderError (one line) when it fails, runs out of time or memory."""
    seconds = RENDER_SECONDS if seconds is None else seconds
    if trusted:
        return render_here(source, views, specials, max_chars)
    request = json.dumps({"source": source, "views": views, "specials": specials, "max_chars": max_chars})
    try:  # subprocess.run kills the child when the time is up
        done = subprocess.run([sys.executable, "-I", str(Path(__file__).resolve())], input=request.encode(),
                              capture_output=True, timeout=seconds, check=False)
    except subprocess.TimeoutExpired:
        raise RenderError(f"did not finish rendering within {seconds:g} s (stopped)") from None
    try:
        reply = json.loads(done.stdout)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        why = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        raise RenderError(f"the render stopped ({why}; out of memory or a crash)")
    if "error" in reply:
        raise RenderError(str(reply["error"]))
    return [str(r) for r in reply["rendered"]]


def _child() -> None:
    """The child: limits first, then the request from stdin, the reply on stdout."""
    import resource

    request: dict[str, Any] = json.loads(sys.stdin.read())
    resource.setrlimit(resource.RLIMIT_AS, (RENDER_MEMORY, RENDER_MEMORY))
    try:
        reply: dict[str, Any] = {"rendered": render_here(request["source"], request["views"], request["specials"],
                                                         request["max_chars"])}
    except RenderError as e:
        reply = {"error": str(e)}
    except MemoryError:
        reply = {"error": "fails: MemoryError: out of memory"}
    sys.stdout.write(json.dumps(reply))


if __name__ == "__main__":
    _child()
