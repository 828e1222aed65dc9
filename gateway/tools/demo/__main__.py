from gateway.tools.demo.server import main

raise SystemExit(main())
