from dtrain_cli.cli.app import main

main()
