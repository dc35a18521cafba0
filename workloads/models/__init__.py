"""The workloads, one self-registering module each (workloads.base.WORKLOADS imports every module here): a new
workload is one new file."""
