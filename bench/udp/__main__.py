from bench.udp.bench_udp import main

raise SystemExit(main())
