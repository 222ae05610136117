"""The frozen encoders, through the libraries made for them, loaded from local Hugging Face folders:
diffusers' `AutoencoderKLWan` (Wan2.1 and Wan2.2 VAEs), transformers' `UMT5EncoderModel` (+ its
tokenizer) and `CLIPVisionModel` (+ `CLIPImageProcessor`). Nothing from a checkpoint runs as code:
weights from safetensors only (`use_safetensors=True`), no `trust_remote_code`.

What each produces (per clip, in the run's dtype):
- latents: `vae.encode(x).latent_dist.mode()`, x the clip as (1, 3, T, H, W) in [-1, 1], resized
  first (`to_vae_input`: bilinear, align_corners=False, no antialias, on float pixels);
- first-frame conditioning (Wan2.1 I2V): the VAE of [frame 0, zeros x (T-1)], latent frames 1..
  (latent frame 0 equals the clip's own);
- text: the umT5 encoder's last hidden state of the real tokens (attention mask on, no padding kept);
- image: CLIP's penultimate hidden state (257 x 1280 for ViT-H/14) of the first frame, as Wan's
  I2V pipelines take it.
`model_digest` names an encoder by the content of its folder's files, for the fingerprint.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from datakit.durable import file_sha256
from datakit.errors import ConfigError
from datakit.shards.features import torch_dtype


def _import(module: str, flag: str) -> Any:
    """The library, its progress bars and load-time advice off (a run prints its own progress)."""
    try:
        lib = __import__(module)
    except ImportError:
        raise ConfigError(flag, f"needs {module}: pip install 'robodata[encode]'") from None
    lib.utils.logging.set_verbosity_error()
    lib.utils.logging.disable_progress_bar()
    return lib


def model_folders(path: Path, sibling: str) -> list[Path]:
    """The folder and, in the diffusers repo layout, its sibling (`../tokenizer`, `../image_processor`)."""
    other = path.parent / sibling
    return [path, other] if other.is_dir() and other != path else [path]


def model_digest(folders: list[Path]) -> str:
    """sha256 over (folder, file name, file sha256) of every file in `folders` (not recursive)."""
    h = hashlib.sha256()
    for k, folder in enumerate(folders):
        for f in sorted(p for p in folder.iterdir() if p.is_file()):
            h.update(f"{k}\0{f.name}\0{file_sha256(f)}\0".encode())
    return h.hexdigest()


def _check_folder(path: Path, flag: str) -> None:
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ConfigError(flag, f"{path}: not a Hugging Face model folder (no config.json)")
    if not any(path.glob("*.safetensors")):
        raise ConfigError(flag, f"{path}: no .safetensors weights (other formats are not loaded)")


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]


def _weights_numel(path: Path, flag: str) -> int:
    """Values held by the folder's .safetensors files, from their headers (no tensor read)."""
    from safetensors import safe_open

    total = 0
    for f in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(f), "pt") as h:
                for key in h.keys():
                    total += math.prod(h.get_slice(key).get_shape())
        except Exception as e:  # noqa: BLE001 - safetensors raises its own and bare errors for a bad file
            raise ConfigError(flag, f"{f}: not a readable safetensors file ({type(e).__name__}: {_short(e)})") from None
    return total


def _load(flag: str, path: Path, what: str, build: Callable[[], torch.nn.Module],
          load: Callable[[], tuple[torch.nn.Module, dict]]) -> torch.nn.Module:
    """Load the encoder, refused in one line naming the folder: a config.json that does not build
    `what` (built on the meta device: no memory, whatever its sizes), a model larger than its
    weights (an absurd config, or decoy weights), a load that fails, or weights missing tensors
    (they would be left at random init)."""
    try:
        with torch.device("meta"):
            wanted = sum(p.numel() for p in build().parameters())
    except (Exception, MemoryError) as e:  # noqa: BLE001 - a bad config fails in the library's own ways
        raise ConfigError(flag, f"{path}: config.json does not describe a {what} ({type(e).__name__}: "
                                f"{_short(e)})") from None
    held = _weights_numel(path, flag)
    if wanted > held:
        raise ConfigError(flag, f"{path}: config.json describes a {what} of {wanted:,} parameters, its weights hold "
                                f"{held:,} values: not this config's weights")
    try:
        model, info = load()
    except (Exception, MemoryError) as e:  # noqa: BLE001
        raise ConfigError(flag, f"{path}: does not load as a {what} ({type(e).__name__}: {_short(e)})") from None
    missing = list(info.get("missing_keys") or ()) + list(info.get("mismatched_keys") or ())
    if missing:
        raise ConfigError(flag, f"{path}: its weights lack {len(missing)} of the {what}'s tensors (e.g. "
                                f"{str(missing[0])[:120]}): not this model's weights")
    return model


def to_vae_input(frames: torch.Tensor, size: tuple[int, int] | None) -> torch.Tensor:
    """(N, T, H, W, 3) uint8 -> (N, 3, T, h, w) float32 in [-1, 1], resized to `size` bilinearly."""
    n, t, h, w, _ = frames.shape
    x = frames.permute(0, 1, 4, 2, 3).reshape(n * t, 3, h, w).float()
    if size is not None and tuple(size) != (h, w):
        x = F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False, antialias=False)
    x = x / 127.5 - 1.0
    return x.reshape(n, t, 3, *x.shape[-2:]).permute(0, 2, 1, 3, 4).contiguous()


class Encoders:
    """The loaded encoders of one run, on one device."""

    def __init__(self, vae: Path | None, text: Path | None, image: Path | None, dtype: str, device: str,
                 text_len: int = 512):
        """Each encoder given is loaded (a text-only worker passes no VAE)."""
        self.dtype, self.device, self.text_len = torch_dtype(dtype), torch.device(device), text_len
        self.vae = self.text = self.tokenizer = self.image = self.processor = None
        if vae is not None:
            _check_folder(vae, "--vae")
            diffusers = _import("diffusers", "--vae")
            cls = diffusers.AutoencoderKLWan
            self.vae = _load("--vae", vae, cls.__name__, lambda: cls.from_config(cls.load_config(vae)),
                             lambda: cls.from_pretrained(vae, torch_dtype=self.dtype, use_safetensors=True,
                                                         output_loading_info=True))
            self.vae.to(self.device).eval().requires_grad_(False)
        if text is not None:
            _check_folder(text, "--text-encoder")
            tf = _import("transformers", "--text-encoder")
            tok_dir = next((p for p in model_folders(text, "tokenizer") if any(p.glob("tokenizer*"))
                            or any(p.glob("spiece.model"))), text)
            try:
                self.tokenizer = tf.AutoTokenizer.from_pretrained(tok_dir, trust_remote_code=False)
            except (Exception, MemoryError) as e:  # noqa: BLE001
                raise ConfigError("--text-encoder", f"{tok_dir}: no loadable tokenizer ({type(e).__name__}: "
                                                    f"{_short(e)})") from None
            cls = tf.UMT5EncoderModel
            self.text = _load("--text-encoder", text, cls.__name__,
                              lambda: cls(cls.config_class.from_pretrained(text)),
                              lambda: cls.from_pretrained(text, torch_dtype=self.dtype, use_safetensors=True,
                                                          trust_remote_code=False, output_loading_info=True))
            self.text.to(self.device).eval().requires_grad_(False)
        if image is not None:
            _check_folder(image, "--image-encoder")
            tf = _import("transformers", "--image-encoder")
            proc_dir = next((p for p in model_folders(image, "image_processor")
                             if (p / "preprocessor_config.json").is_file()), image)
            try:
                self.processor = tf.CLIPImageProcessor.from_pretrained(proc_dir)
            except (Exception, MemoryError) as e:  # noqa: BLE001
                raise ConfigError("--image-encoder", f"{proc_dir}: no loadable image processor ({type(e).__name__}: "
                                                     f"{_short(e)})") from None
            cls = tf.CLIPVisionModel
            self.image = _load("--image-encoder", image, cls.__name__,
                               lambda: cls(cls.config_class.from_pretrained(image)),
                               lambda: cls.from_pretrained(image, torch_dtype=self.dtype, use_safetensors=True,
                                                           trust_remote_code=False, output_loading_info=True))
            self.image.to(self.device).eval().requires_grad_(False)

    def vae_facts(self) -> dict[str, Any]:
        c = self.vae.config
        return {"class": type(self.vae).__name__, "z_dim": int(c.z_dim), "latents_mean": list(c.latents_mean),
                "latents_std": list(c.latents_std), "scale_factor_spatial": int(c.scale_factor_spatial),
                "scale_factor_temporal": int(c.scale_factor_temporal)}

    @torch.inference_mode()
    def latents(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 3, T, h, w) in [-1, 1] -> (N, C, T', h', w') posterior modes, in the run's dtype."""
        return self.vae.encode(x.to(self.device, self.dtype)).latent_dist.mode()

    @torch.inference_mode()
    def first_frame_cond(self, x: torch.Tensor) -> torch.Tensor:
        """Wan2.1 I2V conditioning: the VAE of [frame 0, zeros], latent frames 1.. only."""
        cond = torch.cat([x[:, :, :1], torch.zeros_like(x[:, :, 1:])], dim=2)
        return self.latents(cond)[:, :, 1:]

    @torch.inference_mode()
    def text_embedding(self, prompt: str) -> torch.Tensor:
        """(tokens, width): the encoder's output on the prompt's real tokens."""
        enc = self.tokenizer([prompt], max_length=self.text_len, truncation=True, add_special_tokens=True,
                             return_tensors="pt")
        ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        out = self.text(input_ids=ids, attention_mask=mask).last_hidden_state
        return out[0, : int(mask.sum())]

    @torch.inference_mode()
    def image_features(self, frame: np.ndarray) -> torch.Tensor:
        """(257, 1280) for ViT-H/14: CLIP's penultimate hidden state of one (H, W, 3) uint8 frame."""
        pixels = self.processor(images=[frame], return_tensors="pt")["pixel_values"]
        out = self.image(pixel_values=pixels.to(self.device, self.dtype), output_hidden_states=True)
        return out.hidden_states[-2][0]


def _config(path: Path, flag: str) -> dict[str, Any]:
    _check_folder(path, flag)
    try:
        d = json.loads((path / "config.json").read_text())
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError, RecursionError) as e:
        raise ConfigError(flag, f"{path / 'config.json'}: unreadable ({e})") from None


def feature_shapes(cfg: Any, size: tuple[int, int]) -> tuple[dict[str, list[int]], dict[str, Any], int]:
    """(per-clip field shapes, the VAE facts a trainer needs, text width) from the encoders'
    config.json alone (a fully resumed run loads no weights). The size must be a multiple of the
    VAE's spatial factor, so the latent shape is exact."""
    c = _config(cfg.vae, "--vae")
    try:
        z, sf, tf = int(c.get("z_dim", 16)), int(c.get("scale_factor_spatial") or 8), int(c.get("scale_factor_temporal") or 4)
        vae = {"class": c.get("_class_name", "AutoencoderKLWan"), "z_dim": z, "scale_factor_spatial": sf,
               "scale_factor_temporal": tf, "latents_mean": [float(v) for v in c.get("latents_mean", [])],
               "latents_std": [float(v) for v in c.get("latents_std", [])]}
    except (TypeError, ValueError) as e:
        raise ConfigError("--vae", f"{cfg.vae / 'config.json'}: unexpected values ({e})") from None
    h, w = size
    if h % sf or w % sf:
        raise ConfigError("--size", f"{h}x{w} is not a multiple of the VAE's spatial factor {sf}")
    t = 1 + (cfg.frames - 1) // tf
    shapes = {"latents": [z, t, h // sf, w // sf]}
    if cfg.cond == "first-frame":
        shapes["cond_latents"] = [z, t - 1, h // sf, w // sf]
    if cfg.image_encoder is not None:
        ic = _config(cfg.image_encoder, "--image-encoder")
        ic = ic.get("vision_config", ic)
        shapes["image"] = [(int(ic["image_size"]) // int(ic["patch_size"])) ** 2 + 1, int(ic["hidden_size"])]
    text_width = int(_config(cfg.text_encoder, "--text-encoder")["d_model"]) if cfg.text_encoder else 0
    return shapes, vae, text_width
