from fermium.cli import main

main()
