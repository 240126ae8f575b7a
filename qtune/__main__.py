from qtune.cli import main

main()
