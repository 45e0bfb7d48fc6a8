"""The TPU-only pieces on a CPU: the real RPA kernel interpreted (`cpu.rpa`, with `pallas_*`), and what a CPU
`vllm serve` needs (`cpu.serving`: mesh, HBM, compiler options, the kernel choice of `cpu.kernel_choice`).

Production code never imports this package: the entry points (the vLLM plugin, `serve`, `doctor`, the demo, the
test kit) install it on CPU devices, and the kernel dispatcher enters the interpret mode it hands over."""
