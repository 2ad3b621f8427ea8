"""The project's GPU check (``make gpu-check OUT=dir``): exactness on CUDA and the speed of every
mode at Mistral-7B's shape, in at most eight files. ``check.py`` runs the phases."""
