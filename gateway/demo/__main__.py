from gateway.demo.server import main

raise SystemExit(main())
