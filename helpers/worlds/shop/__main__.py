from helpers.worlds.shop.build import main

main()
