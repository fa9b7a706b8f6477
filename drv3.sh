#!/usr/bin/env bash
OUT=$1
timeout 240 python3 -m pytest -q -x tests/python/test_symbolic_plans.py tests/python/test_cuda_runtime.py tests/python/test_stored_captures.py tests/python/test_dynamic_shapes.py > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
timeout 400 python3 bench/bench_serving.py --device cuda --workloads bert llm_dynamic llm_static --prompts 8 --compilers eager kiln --warm-process 4 --json $OUT/serving.jsonl > $OUT/bench.txt 2>&1
tail -9 $OUT/bench.txt
