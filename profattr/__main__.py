from profattr.cli import main

main()
