from bench.driver.bench_driver import main

raise SystemExit(main())
