"""What the GPU checks (scripts/gpu_check.py, scripts/nccl_check.py) decide without a GPU: the profiler trace
read for stream overlap (`trace`), host synchronizations attributed to the thread that caused them (`syncs`),
and the table in which each check stands beside a negative control that must fail (`table`). Kept apart
from the scripts so that tests/test_gpu_check.py proves them on recorded traces and real threads on a CPU."""
