"""What the GPU checks (scripts/gpu_check.py, scripts/nccl_check.py) decide without a GPU: the profiler trace
read for stream overlap (`trace`), host synchronizations attributed to the thread that caused them (`syncs`),
the verdicts on what the ranks returned (`verdicts`), and the table in which each check stands beside a
negative control that must fail (`table`). Kept apart from the scripts so that tests/test_gpu_check.py proves
them on a CPU: on hand-made traces in the profiler's export format and on real threads."""
