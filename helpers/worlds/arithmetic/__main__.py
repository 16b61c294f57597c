from helpers.worlds.arithmetic.build import main

main()
