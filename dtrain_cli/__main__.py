from dtrain_cli.cli.entry import main

main()
