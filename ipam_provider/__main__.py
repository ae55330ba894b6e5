from ipam_provider.cli import main

raise SystemExit(main())
