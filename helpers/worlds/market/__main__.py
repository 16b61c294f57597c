from helpers.worlds.market.build import main

main()
