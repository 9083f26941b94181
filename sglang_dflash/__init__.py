"""DFlash block-diffusion speculative decoding as an SGLang plugin."""
