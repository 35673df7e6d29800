from dfpo.cli import main
from dfpo.trainer.exit_signals import end_of_program

end_of_program(main())
