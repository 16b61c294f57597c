from helpers.worlds.games.build import main

main()
