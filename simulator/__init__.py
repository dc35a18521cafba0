"""A step simulator on SimGrid: what a training step of each scheme costs on a cluster this machine is not.

Harness code (never imported by `zen`): schedules recorded from the real schemes (`record`), platforms
(`platform`), a step's compute timeline (`timeline`), the SimGrid run (`engine`), the step built from them
(`step`), and the command line (`cli`, `python -m simulator`).
"""
