from tfrecordd.cli import main

raise SystemExit(main())
