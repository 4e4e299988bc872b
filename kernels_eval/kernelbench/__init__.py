"""KernelBench as a task source: a local KernelBench clone's problem files as evaluator tasks.

problems   parse and select problem files (ast only), the id-hash train/eval split
sizes      check sizes from the module-level constants, and the override table
reference  worker side: the torch reference in the sandbox, seeded as KernelBench seeds it
jobs       the reference job, parent side: payload and strict reading of its frames
tasks      `load_tasks(folder, evaluator, ...)`: problems -> `Task`s
render     the Pallas and CUDA contracts of a KernelBench task
answers    KernelBench's CUDA answer format (ModelNew + load_inline): static checks and nvcc compile
evaluate   one evaluation (called by `Evaluator` for tasks whose `kernelbench` is set)
metrics    per-level Acc@k and fast_p
Nothing is downloaded: the user points `load_tasks` (or `--config.tasks.kernelbench_dir`) at a local clone.
"""
