from dfpo.cli import main

raise SystemExit(main())
