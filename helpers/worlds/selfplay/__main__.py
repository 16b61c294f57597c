from helpers.worlds.selfplay.build import main

main()
