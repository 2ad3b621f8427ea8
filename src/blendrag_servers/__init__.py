"""Throwaway servers on 127.0.0.1 for the tests and the benchmarks (a local Redis), started on a
free port in a temporary directory and stopped by their PID. The core never imports this
package."""
