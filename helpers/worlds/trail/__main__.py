from helpers.worlds.trail.build import main

main()
