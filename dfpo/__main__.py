from dfpo.cli import main
from dfpo.trainer.run.signals import end_of_program

end_of_program(main())
