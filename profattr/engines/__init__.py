"""What profattr knows about the serving engines it captures (SGLang): their MoE runner backends and the kernel
families each one launches (sglang.toml, read by sglang.py), and what their server logs say (serverlog.py). Below
both capture/ (which starts the engine and writes its log beside the capture) and check/ (which reads them back)."""
